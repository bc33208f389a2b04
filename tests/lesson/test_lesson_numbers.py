"""The attention lesson's numbers (lesson/attention_lesson.py, docs/attention.md), each pinned at the
precision
the source texts print it, computed by the package's own attention, masks and multi-head attention.

Where a number depends on a random draw the texts do not pin, the test pins ours (docs/attention.md says so).
"""

import attention_lesson
import pytest
import torch
from helpers import DATA_DIR, ROOT, needs_data
from sections import equation, heads, masking, pitfalls, properties, scaling

from transformer.core.batches import collate, make_batches
from transformer.core.masks import decoder_self_mask, padding_mask
from transformer.core.tokenizer import Tokenizer
from transformer.training.multi30k import load_multi30k
from transformer.training.splits import encode_split


def close(got, want, places: int) -> bool:
    """Equal once rounded to ``places`` decimals, element by element (nested lists)."""
    if isinstance(got, (list, tuple)):
        return len(got) == len(want) and all(close(g, w, places) for g, w in zip(got, want))
    return round(got, places) == pytest.approx(want, abs=10 ** -(places + 3))


@pytest.fixture(scope="module")
def lesson_sections():
    """The lesson's sections, run once for this module (from the seed every test starts from)."""
    torch.manual_seed(0)
    return attention_lesson.run_sections()


def ran(sections, key: str):
    """The section ``key`` of the lesson's run."""
    (section,) = [section for _, _, section in sections if section.key == key]
    return section


def test_the_doc_shows_what_the_script_prints_and_links_hold_their_code(lesson_sections, monkeypatch, capsys):
    monkeypatch.setattr(attention_lesson, "run_sections", lambda: lesson_sections)
    assert attention_lesson.main(["--check-doc", str(ROOT / "docs" / "attention.md")]) == 0, (
        capsys.readouterr()
    )


def test_the_doc_check_catches_a_changed_number_and_a_stale_link(lesson_sections, tmp_path):
    texts = {section.key: attention_lesson.section_text(n, section) for _, n, section in lesson_sections}
    doc = (ROOT / "docs" / "attention.md").read_text(encoding="utf-8")
    (tmp_path / "attention.md").write_text(doc, encoding="utf-8")
    assert attention_lesson.check_doc(tmp_path / "attention.md", texts) == 0
    for broken in (
        doc.replace("0.576   0.140   0.284", "0.576   0.141   0.284", 1),
        doc.replace("attention.py#L36", "attention.py#L37", 1),
    ):
        assert broken != doc
        (tmp_path / "attention.md").write_text(broken, encoding="utf-8")
        assert attention_lesson.check_doc(tmp_path / "attention.md", texts) == 1


# ---------------------------------------------------------------- part A: §3.2 step by step


def test_three_tokens():
    n = equation.three_tokens().numbers
    assert close(n["scaled"], [[1.414, 0.0, 0.707], [0.0, 1.414, 0.707], [1.414, 1.414, 1.414]], 3)
    assert close(n["weights"], [[0.576, 0.14, 0.284], [0.14, 0.576, 0.284], [0.333, 0.333, 0.333]], 3)
    assert close(n["output"], [[7.18, 2.82], [2.82, 7.18], [5.0, 5.0]], 2)


def test_numpy_reference_and_library():
    assert equation.numpy_reference().numbers["diff"] < 1e-12  # float64, the same sums
    n = equation.library_check().numbers
    assert close(n["ours"], [[7.1797, 2.8203], [2.8203, 7.1797], [5.0, 5.0]], 4) and n["lib"] == n["ours"]
    assert n["diff"] < 1e-6 and n["random_diff"] < 1e-6  # float32 rounding (the text: 4.8e-07, 6.0e-07)


def test_variance_table_follows_d_k(lesson_sections):
    n = ran(lesson_sections, "variance_table").numbers  # our seeded draw: the text's own draw is not given
    for d_k, (variance, scaled_std) in n.items():
        assert abs(variance / d_k - 1) < 0.02 and abs(scaled_std - 1) < 0.01
    assert close([n[4][0], n[512][0]], [3.96, 510.68], 2)  # ours, pinned (the text: 3.99, 514.16)


def test_ten_keys_saturate_without_the_scale():
    n = (
        scaling.ten_keys().numbers
    )  # ours (the text: 0.8407/0.1339, 0.2484/0.1867, 1.0000/0.0000, 0.5176/0.2497)
    assert close(list(n["unscaled64"]), [0.7264, 0.1988], 4) and close(
        list(n["scaled64"]), [0.2110, 0.1665], 4
    )
    assert close(list(n["unscaled512"]), [1.0, 0.0], 4)  # the text's figures exactly: saturated
    assert close(list(n["scaled512"]), [0.3401, 0.2244], 4)


def test_parameters_are_4d2_plus_4d_for_every_h():
    n = heads.parameters().numbers
    assert n["per_head"] == 786_432 == 3 * 512 * 512
    assert {n["counts"][(512, H)] for H in (1, 8, 16, 64)} == {1_050_624}
    assert {n["counts"][(16, H)] for H in (1, 4)} == {1_088}


def test_line_by_line_shapes_and_exact_agreement():
    n = heads.line_by_line().numbers
    assert n["shapes"] == [
        (2, 5, 16),
        (2, 5, 16),
        (2, 5, 4, 4),
        (2, 4, 5, 4),
        (2, 4, 5, 4),
        (2, 4, 5, 5),
        (2, 4, 5, 5),
        (2, 4, 5, 4),
        (2, 5, 4, 4),
        (2, 5, 16),
        (2, 5, 16),
    ]
    assert n["diff"] < 1e-6  # float rounding: 0.0 on some CPUs, 4.5e-08 on others


def test_against_nn_multihead_attention():
    n = heads.against_library().numbers
    assert n["output"] < 1e-6 and n["weights"] < 1e-6 and n["causal"] < 1e-6
    assert n["params"] == 1088


def test_minus_infinity_example():
    n = masking.minus_infinity().numbers
    assert close(n["masked"], [0.731, 0.269, 0.0], 3)
    assert close(n["unmasked"], [0.047, 0.017, 0.936], 3)


def test_causal_table_is_the_texts_to_the_last_digit():
    n = masking.causal_table().numbers
    assert close(n["scores"][1], [-0.057, 0.968, 0.105, 0.652, -1.325], 3)
    assert close(
        n["weights"],
        [
            [1.0, 0, 0, 0, 0],
            [0.264, 0.736, 0, 0, 0],
            [0.379, 0.355, 0.266, 0, 0],
            [0.432, 0.071, 0.146, 0.351, 0],
            [0.1, 0.254, 0.255, 0.326, 0.065],
        ],
        3,
    )
    diffs = n["diffs"]
    assert max(diffs.values()) < 1e-6 and diffs["ours with the additive mask"] == 0.0


def test_mask_mistakes_numbers():
    n = masking.mask_mistakes().numbers
    assert close(n["row_sums"], [0.119, 0.52, 0.617, 0.955, 1.0], 3)
    assert close(n["future"], [0.832, 0.456, 0.391, 0.193, 0.0], 3)
    assert close(n["after"][1], [0.137, 0.383, 0, 0, 0], 3)


def test_every_mistake_is_far_off_where_it_applies():
    n = pitfalls.eight_mistakes().numbers
    assert set(n[None]) == {"encoder", "decoder", "cross"} and max(n[None].values()) < 1e-6  # rounding
    for mistake, row in n.items():
        if mistake is not None:
            applies = {
                k: v for k, v in row.items() if not (mistake == "causal_everywhere" and k == "decoder")
            }
            assert min(applies.values()) > 0.05, (mistake, row)
    assert n["causal_everywhere"]["decoder"] < 1e-6  # the decoder is causal already: rounding only


# ---------------------------------------------------------------- part B: the properties behind it


def test_quick_checks():
    n = equation.quick_checks().numbers
    assert close(n["weights"], [0.6, 0.2, 0.2], 3) and close(n["output"], [0.6, 0.2], 3)
    assert n["shapes"] == ((10, 10), (10, 8))


def test_cost_counted_on_our_block(lesson_sections):
    counted = ran(lesson_sections, "cost").numbers["counted"]
    assert round(counted[(512, 512)]["projections"] / 1e9, 2) == 1.07 == round(8 * 512**3 / 1e9, 2)
    assert round(counted[(512, 512)]["attention"] / 1e9, 2) == 0.54
    for T, D in ((1024, 512), (2048, 1024)):  # T = 2 D: the two parts cost the same
        assert counted[(T, D)]["projections"] == counted[(T, D)]["attention"] == 8 * T * D * D


def test_variance_with_the_lessons_own_generator(lesson_sections):
    n = ran(lesson_sections, "variance_seeded").numbers
    assert (n[16], n[64], n[256]) == ((16.0, 1.0), (63.8, 1.0), (255.3, 1.0))
    assert abs(n["sigma4"] - 16) < 0.3


def test_softmax_jacobian_and_its_shrink():
    n = scaling.saturation().numbers
    probs, size, ok = n[(2.0, 1.0, 0.0)]
    assert ok and close(probs, [0.665, 0.245, 0.090], 3) and round(size, 3) == 0.223
    probs, size, ok = n[(16.0, 8.0, 0.0)]
    assert ok and close(probs[:2], [0.99966, 0.00034], 5) and close(probs[2], 0.0000001, 7)
    assert f"{size:.2e}" == "3.35e-04"
    assert 650 < n["shrink"] < 670 and round(n["p1p2"], 3) == 0.045


def test_saturation_bound_and_vjp():
    n = scaling.saturation_bound().numbers
    assert 0 < n["worst"] <= 1.0 and n["vjp"] < 1e-15


def test_many_keys_simulation():
    n = scaling.many_keys().numbers  # the text: about 0.8 and ~95 %; about 0.98
    assert round(n[64][0], 1) == 0.8 and round(n[64][1], 2) == 0.95 and round(n[256][0], 2) == 0.98


def test_backward_formulas_equal_autograd():
    n = scaling.backward().numbers
    assert max(n.values()) < 1e-14


def test_fully_masked_row_on_this_torch():
    n = masking.fully_masked_row().numbers
    assert all(x != x for x in n["the formula with -inf"])  # NaN
    assert n["ours"] == [0.0] * 4 and n["F.scaled_dot_product_attention"] == [0.0] * 4


def test_conventions_and_positions():
    assert masking.conventions().numbers["flipped"] > 0.5
    assert close(masking.positions().numbers["first"], [1.0, 0.5, 0.333, 0.25, 0.2, 0.167], 3)


def test_cross_shapes_and_permutation():
    n = heads.cross_shapes().numbers
    assert (n["queries"], n["keys and values"], n["weights"], n["output"]) == (
        (2, 4, 5, 16),
        (2, 4, 7, 16),
        (2, 4, 5, 7),
        (2, 5, 64),
    )
    assert heads.permutation().numbers == {"plain": True, "masked": False}


def test_worked_example():
    n = equation.worked_example().numbers
    # the text prints 0.504 for the last weight of row 3: 0.50349... rounds to 0.503 (docs/attention.md)
    assert close(n["weights"], [[0.401, 0.198, 0.401], [0.198, 0.401, 0.401], [0.248, 0.248, 0.503]], 3)
    assert close(n["output"], [[0.802, 0.599], [0.599, 0.802], [0.752, 0.752]], 3)
    assert close(n["causal_weights"][1], [0.330, 0.670, 0.0], 3)
    assert close(n["causal_output"], [[1.0, 0.0], [0.330, 0.670], [0.752, 0.752]], 3)
    assert n["jacobian"] == 0.221 and n["lib"] < 1e-12


# ---------------------------------------------------------------- the project's batches


def test_the_masks_of_a_padded_batch_leave_no_query_without_a_key():
    assert masking.batch_masks().numbers == {
        "encoder self (padding)": 0,
        "decoder self (causal + padding)": 0,
        "cross (padding)": 0,
    }


@needs_data
def test_no_batch_built_from_the_validation_set_has_a_fully_masked_row(tiny_checkpoint):
    tokenizer = Tokenizer(tiny_checkpoint.parent / "tokenizer.model")
    val = load_multi30k("de", "en", DATA_DIR)["validation"]
    src_ids, tgt_ids = encode_split(val, tokenizer)
    src_ids, tgt_ids = src_ids + [[]], tgt_ids + [[]]  # and an empty pair, the worst case
    batches = make_batches([len(s) for s in src_ids], [len(t) for t in tgt_ids], 2000, shuffle=False)
    for indices in batches:
        batch = collate([(src_ids[i], tgt_ids[i]) for i in indices], indices, 0, 2, 3)
        B, S = batch.src.shape
        T = batch.tgt_in.size(1)
        assert padding_mask(batch.src, 0).expand(B, 1, S, S).any(-1).all()  # encoder self and cross
        assert decoder_self_mask(batch.tgt_in, 0).any(-1).all()
        assert padding_mask(batch.src, 0).expand(B, 1, T, S).any(-1).all()
    assert sum(len(b) for b in batches) == len(src_ids)
    assert torch.equal(collate([([], [])], [0], 0, 2, 3).src, torch.tensor([[3]]))  # the empty line: its EOS


def test_multihead_attention_gives_a_fully_padded_sentence_nan_or_zeros_by_path_and_shape():
    """The doc's claim about nn.MultiheadAttention, pinned on this PyTorch: no path is zeros everywhere."""
    paths = masking.fully_masked_row().numbers["module paths"]
    fast, quiet, loud = "fast (no_grad)", "general, need_weights=False", "general, need_weights=True"
    assert [paths[shape][fast] for shape in paths] == ["zeros", "NaN", "NaN", "NaN"]
    assert all(found[quiet] == "zeros" and found[loud] == "NaN" for found in paths.values())


def test_the_source_texts_remaining_points():
    """Low rank, μP's scale, rows not columns, memory, a whole encoder's symmetry, the Jacobian, the card."""
    assert properties.low_rank().numbers["ranks"] == {2: 2, 4: 4, 8: 8, 16: 12}  # min(d_k, T)
    means = properties.correlated_scale().numbers["means"]
    assert [round(means[d][0]) for d in (16, 64, 256)] == [4, 8, 16]  # the texts' ≈ 4 / 8 / 16
    assert all(abs(means[d][1] - 1.0) < 0.01 for d in means)  # 1/d_k: near 1
    rows = properties.rows_not_columns().numbers
    assert rows["rows"] == pytest.approx([1.0] * 4) and max(abs(c - 1.0) for c in rows["columns"]) > 0.3
    sizes = properties.memory_cost().numbers["bytes"]
    assert sizes[512] == 16 * sizes[128] and sizes[8192] == 2**31  # T²: 4x the length, 16x the bytes
    symmetry = properties.encoder_permutation().numbers
    assert symmetry["equivariant"] < 1e-12 and symmetry["invariant"] < 1e-12
    eigenvalues = properties.jacobian_sign().numbers["eigenvalues"]
    assert min(eigenvalues) > -1e-12 and sorted(eigenvalues)[0] == pytest.approx(0.0, abs=1e-12)
    assert properties.recall_card().numbers["weights"] == pytest.approx([0.25, 0.75])
