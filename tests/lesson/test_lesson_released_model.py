"""lesson/released_model.py on its random seeded fallback (the Hub is never contacted): the header and the
eight parts are printed, our attention equals Marian's block for block, the plain formula differs by float32
rounding only, no decoder row sees the future, rows say what they read and predict, each classic mistake is
far off, and the walk-through's own figures (block shapes and parameters, the three uses, a row's top 3
source tokens, mistakes 1 and 3) agree with the tables they restate."""

import contextlib
import io
import math
import re

import pytest
import torch

from transformer.core.attention import MultiHeadAttention

pytest.importorskip("transformers")
import mistakes
import released_model

BLOCKS = ["encoder.0.self", "encoder.1.self", "decoder.0.self", "decoder.0.cross", "decoder.1.self",
          "decoder.1.cross"]  # fmt: skip
LAYER_0 = ["encoder.0.self", "decoder.0.self", "decoder.0.cross"]
NUMBER = r"(\d\.\d\de[+-]\d\d)"
SHAPE = r"\(([\d, ]+)\)"
# The reference the random fallback teacher-forces, as its SentencePiece pieces, then EOS.
PREDICTED = ["▁Zwei", "▁j", "unge", "▁H", "unde", "▁spielen", "▁im", "▁Sch", "nee", ".", "</s>"]


def run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert released_model.main(argv) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def default_run() -> str:
    """`python lesson/released_model.py --model random`, printed once for the tests of this file."""
    return run(["--model", "random"])


def section(output: str, number: int) -> str:
    return output.split(f"== {number}.")[1].split("\n== ")[0]


def shapes(line: str) -> list[tuple[int, ...]]:
    return [tuple(int(n) for n in shape.split(", ")) for shape in re.findall(SHAPE, line)]


def three_uses(text: str) -> dict[str, list[tuple[int, ...]]]:
    """{block: [its shapes, in the order printed]} of part 2's lines on the three uses."""
    return {
        m.group(1): shapes(m.group(2))
        for m in re.finditer(r"^  [\w -]+\(((?:en|de)coder\.0\.\w+)\): (.*)$", text, re.M)
    }


def table(text: str, columns: int) -> dict[str, list[float]]:
    """{block: [numbers]} of the rows of a section that start with a block name."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"((?:en|de)coder\.\d\.\w+)\s", line)
        if match:
            rows[match.group(1)] = [float(x) for x in re.findall(NUMBER, line)]
            assert len(rows[match.group(1)]) == columns, line
    return rows


def mistakes_table(text: str) -> dict[str, dict[str, float | None]]:
    """{row title: {block: max |Δ| or None for '-'}} of part 7 (one row per mistake, a column per block)."""
    lines = text.splitlines()[1:]
    blocks = lines[0].split()
    rows = {}
    for line in lines[1:]:
        cells = line[22:].split()
        assert len(cells) == len(blocks), line
        rows[line[:22].strip()] = {b: None if c == "-" else float(c) for b, c in zip(blocks, cells)}
    return rows


def test_walk_through_on_the_random_model(default_run):
    out = default_run
    assert "RANDOM Marian, opus-mt-en-de layout, reduced size" in out
    assert "(given, teacher-forced)" in out and "+ 3 × <pad>" in out
    blocks = table(section(out, 1), 2)
    assert list(blocks) == BLOCKS
    for name, (output, weights) in blocks.items():
        assert output <= 1e-5 and weights <= 1e-6, name  # float32; in fact bit-identical here
    heads = section(out, 4).splitlines()
    assert "decoder layer 0 (from 0; layer 1 of 2 counted from 1)" in heads[0]  # the penultimate
    assert heads[1].split()[:6] == ["read", "->", "predicted", "mean", "of", "heads"]
    assert heads[1].split()[6:] == [w for h in range(8) for w in ("head", str(h))]
    assert len(heads) == 2 + len(PREDICTED) + 1  # a row per decoder position, EOS's included; the top 3
    alignment = section(out, 5)
    targets = re.findall(r"^(\d+):(\S+)", alignment, re.M)
    assert [w for _, w in targets] == ["Zwei", "junge", "Hunde", "spielen", "im", "Schnee."]
    assert re.search(r"pharaoh \(source-target\): (\d+-\d+ ?)+$", alignment, re.M)


def test_every_mistake_is_far_off_and_ours_is_exact(default_run):
    rows = mistakes_table(section(default_run, 7))
    assert list(rows) == ["ours", *mistakes.MISTAKES.values()]
    assert list(rows["ours"]) == BLOCKS
    for block in BLOCKS:
        assert rows["ours"][block] < 1e-5, block
        for name, title in mistakes.MISTAKES.items():
            if name == "causal_everywhere" and block.endswith(".self") and block.startswith("decoder"):
                assert rows[title][block] is None  # printed '-': the block is causal already
            else:
                assert rows[title][block] > 1e-3, (title, block)


def test_the_plain_formula_differs_by_rounding_only(default_run, monkeypatch):
    """Ours is bit-identical to Marian's block; the plain x @ W + b formula is not, at d_model 512 on this
    machine's MKL (x @ W + b adds the bias after the product, F.linear's addmm inside it), by ~1e-6."""
    plain = table(section(default_run, 2), 2)
    assert list(plain) == LAYER_0
    for name, (ours, formula) in plain.items():
        assert ours == 0.0 and formula < 1e-4, name  # reduced size: 0.0 too, here
    monkeypatch.setattr(released_model, "REDUCED", dict(encoder_layers=1, decoder_layers=1))  # width 512
    plain = table(section(run(["--model", "random"]), 2), 2)
    assert [ours for ours, _ in plain.values()] == [0.0, 0.0, 0.0]
    assert all(formula < 1e-4 for _, formula in plain.values())
    assert max(formula for _, formula in plain.values()) > 0.0, "the plain formula is no longer plain"


def test_decoder_self_attention_gives_the_future_nothing(default_run):
    lines = section(default_run, 6).splitlines()
    assert "decoder layer 1 (from 0; layer 2 of 2 counted from 1), mean of heads" in lines[0]
    assert lines[1].endswith("every head of every decoder layer: max 0.0e+00")
    rows = [[float(w) for w in re.findall(r"\d\.\d\d", line.split(" -> ")[1])] for line in lines[3:]]
    assert len(rows) == 5 and rows[0] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert all(w == 0.0 for i, row in enumerate(rows) for w in row[i + 1 :])


def test_decoder_rows_are_labelled_read_then_predicted(default_run):
    read = ["<pad>", *PREDICTED[:-1]]  # the start token, then the translation shifted right
    labels = [f"{r} -> {p}" for r, p in zip(read, PREDICTED)]
    cross_rows = section(default_run, 4).splitlines()[2:]
    assert [line[: len(label) + 1] for line, label in zip(cross_rows, labels)] == [f"{x} " for x in labels]
    self_rows = section(default_run, 6).splitlines()[3:]
    assert [line.split("  ")[0] for line in self_rows] == labels[:5]


@pytest.fixture(scope="module")
def chosen_run() -> str:
    """Every choice away from its default: float64, no padding, the last encoder layer, the query '▁are',
    decoder layer 1 for parts 4 and 5, and decoder layer 0's row reading '▁Zwei' for the top 3."""
    return run(["--model", "random", "--dtype", "float64", "--encoder-layer", "-1", "--query-token", "are",
                "--layer", "1", "--pad", "0", "--cross-layer", "0", "--target-token", "Zwei"])  # fmt: skip


def test_encoder_heads_for_a_query_token(chosen_run):
    pieces = ["▁Two", "▁yo", "ung", "▁d", "ogs", "▁are", "▁playing", "</s>"]
    assert released_model.query_position(pieces, None) == 6  # the longest word start
    assert released_model.query_position(pieces, "d") == released_model.query_position(pieces, "▁d") == 3
    assert released_model.query_position(pieces, "ogs") == 4
    out = chosen_run
    lines = section(out, 3).splitlines()
    assert "encoder layer 1 (from 0; layer 2 of 2 counted from 1)" in lines[0]
    assert "query '▁are' (position 5): top 2 keys per head" in lines[0]
    assert "decoder layer 1 (from 0; layer 2 of 2" in section(out, 4).splitlines()[0]
    for h, line in enumerate(lines[1:]):
        keys = re.fullmatch(rf"  head {h}: \[\('(\S+)', (\d\.\d\d)\), \('(\S+)', (\d\.\d\d)\)\]", line)
        assert keys and float(keys.group(2)) >= float(keys.group(4)), line
    assert h == 7
    for output, formula in table(section(out, 2), 2).values():
        assert output <= 1e-12 and formula <= 1e-12  # float64


def test_the_header_counts_one_blocks_parameters_on_the_model(default_run, monkeypatch):
    header = default_run.split("\n== 1.")[0]
    layout = "d_model 128, heads 8, d_k = d_v = 16, encoder layers 2, decoder layers 2; one attention block"
    assert f"\n{layout} (encoder.0.self):\n" in header
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert f"\n  {proj:<8} weight (128, 128)\n" in header, proj
    count = re.search(
        r"^parameters in one multi-head attention block: ([\d,]+) \(4 x (\d+) x \d+ \+ 4 x \d+ = ([\d,]+)\); "
        r"the same in all (\d+) blocks: yes$",
        header,
        re.M,
    )
    counted, D, formula, blocks = (int(g.replace(",", "")) for g in count.groups())
    assert counted == formula == 4 * D * D + 4 * D == 66_048 and blocks == len(BLOCKS)
    monkeypatch.setattr(released_model, "REDUCED", dict(encoder_layers=1, decoder_layers=1))  # width 512
    out = run(["--model", "random", "--pad", "0"])
    # the walk-through's shapes and count, at opus-mt's width
    assert "\n  q_proj   weight (512, 512)\n" in out
    assert "block: 1,050,624 (4 x 512 x 512 + 4 x 512 = 1,050,624); the same in all 3 blocks: yes\n" in out


def test_the_three_uses_shapes_and_largest_outputs(default_run, chosen_run):
    for out, S in ((default_run, 13 + 3), (chosen_run, 13)):  # --pad 3 (the default) and --pad 0
        text, T, D, H = section(out, 2), len(PREDICTED), 128, 8
        assert three_uses(text) == {
            "encoder.0.self": [(1, S, D), (1, H, S, S), (1, S, D)],
            "decoder.0.self": [(1, T, D), (1, H, T, T), (1, T, D)],
            "decoder.0.cross": [(1, T, D), (1, S, D), (1, H, T, S), (1, T, D)],
        }
        cross = f"queries (1, {T}, {D}) from the decoder, keys and values (1, {S}, {D}) from the encoder"
        assert f"(decoder.0.cross): {cross} -> weights" in text
        largest = re.search(
            r"^largest \|output\| of each block: encoder self-attention (\S+), decoder self-attention (\S+), "
            r"cross-attention (\S+)$",
            text,
            re.M,
        )
        rows = [line for line in text.splitlines() if re.match(r"(en|de)coder\.0\.", line)]
        scales = [float(line.split()[-1]) for line in rows]  # the max|output| column
        assert [float(x) for x in largest.groups()] == [round(scale, 1) for scale in scales]


def top_keys(line: str, title: str, read: str, label: str) -> tuple[list[str], list[float]]:
    """The top 3 (source token, weight) of part 4's last line, checked for its layer and row."""
    head = f"{title} cross-attention, query '{read}' (row {label}), mean of 8 heads, top keys: "
    assert line.startswith(head), line
    top = re.fullmatch(r"\[" + ", ".join([r"\('(\S+)', (\d\.\d\d)\)"] * 3) + r"\]", line[len(head) :])
    return list(top.groups()[::2]), [float(w) for w in top.groups()[1::2]]


def test_one_rows_top_3_source_tokens(default_run, chosen_run):
    """By default the row reading '▁spielen' (the longest word start read) of --layer's layer: its top 1 is
    the mean-of-heads cell of part 4's table. --cross-layer 0 --target-token Zwei: that layer and row."""
    lines = section(default_run, 4).splitlines()
    layer_0 = "decoder layer 0 (from 0; layer 1 of 2 counted from 1)"
    keys, weights = top_keys(lines[-1], layer_0, "▁spielen", "▁spielen -> ▁im")
    assert weights == sorted(weights, reverse=True) and len(set(keys)) == 3 and sum(weights) <= 1.0
    row = next(line for line in lines if line.startswith("▁spielen -> ▁im "))
    assert row.split()[3:5] == [keys[0], f"{weights[0]:.2f}"]
    lines = section(chosen_run, 4).splitlines()
    assert "decoder layer 1 (from 0; layer 2 of 2" in lines[0]  # the table: --layer 1
    keys, weights = top_keys(lines[-1], layer_0, "▁Zwei", "▁Zwei -> ▁j")  # the top 3: --cross-layer 0
    assert weights == sorted(weights, reverse=True) and len(set(keys)) == 3
    # layer 0 is the default run's table; padding changes no real row, so its cell is this top 1
    row = next(line for line in section(default_run, 4).splitlines() if line.startswith("▁Zwei -> ▁j "))
    assert row.split()[3:5] == [keys[0], f"{weights[0]:.2f}"]


def test_the_walk_throughs_mistakes_1_and_3_restate_part_7(default_run, chosen_run):
    """Mistake 1: no scale only sharpens (a softmax's top weight grows with the scale of its scores); head
    0 is part 3's head 0, the output figure part 7's. Mistake 3: the shapes look right; the merge is part
    7's."""
    for out, layer, query, S in ((default_run, 0, "▁playing", 16), (chosen_run, 1, "▁are", 13)):
        lines, rows = section(out, 8).splitlines(), mistakes_table(section(out, 7))
        block = f"encoder.{layer}.self"
        title = f"encoder layer {layer} (from 0; layer {layer + 1} of 2 counted from 1) self-attention"
        assert title in lines[0]
        head = re.fullmatch(
            rf"  query '{query}', head 0: top weight (\S+) with the scale, (\S+) without", lines[2]
        )
        with_scale, without = float(head.group(1)), float(head.group(2))
        assert with_scale == float(re.search(r"head 0: \[\('\S+', (\d\.\d\d)\)", section(out, 3)).group(1))
        assert with_scale < without
        largest = re.fullmatch(
            r"  largest weight in any row, all heads: (\S+) with the scale, (\S+) without", lines[3]
        )
        largest_with, largest_without = float(largest.group(1)), float(largest.group(2))
        assert with_scale <= largest_with + 0.005 and largest_with <= largest_without
        assert lines[4] == f"  output: max |Δ| {rows['no 1/√d_k'][block]:.2e}"
        assert lines[5] == "mistake 3, wrong axes:"
        split = f"  split with view(batch, h, n, d_k), no transpose: shapes (1, 8, {S}, 16) (look right), "
        split += "max |Δ| "
        assert lines[6].startswith(split) and float(lines[6][len(split) :]) > 1e-3
        merge = f"  right split, but merge with reshape and no transpose: output (1, {S}, 128) (looks right)"
        assert lines[7] == f"{merge}, max |Δ| {rows['merge w/o transpose'][block]:.2e}"
        assert lines[8] == f"  right split and right merge: max |Δ| {rows['ours'][block]:.2e}"


def test_the_walk_throughs_mistakes_are_computed_as_it_writes_them():
    """``text_mistakes`` against the walk-through's own code, written out here: x @ W + b, view(b, H, n, d_k)
    with no transpose, softmax(Q K^T / √d_k) with -inf, reshape(b, n, d_model) @ W_O + b_O."""
    D, H, n = 16, 4, 6
    block = MultiHeadAttention(D, H).double().eval()
    x = torch.randn(1, n, D, dtype=torch.float64)
    mask = torch.ones(1, 1, 1, n, dtype=torch.bool)
    mask[..., 4:] = False  # two padded keys
    want = block(x, x, x, mask)[0]
    w, b = block.qkv_proj.weight, block.qkv_proj.bias
    W_Q, W_K, W_V = (w[i * D : (i + 1) * D].T for i in range(3))
    b_Q, b_K, b_V = (b[i * D : (i + 1) * D] for i in range(3))
    Q, K, V = ((x @ W + b).view(1, H, n, D // H) for W, b in ((W_Q, b_Q), (W_K, b_K), (W_V, b_V)))
    scores = (Q @ K.transpose(-2, -1) / math.sqrt(D // H)).masked_fill(~mask, float("-inf"))  # (1, H, n, n)
    heads = torch.softmax(scores, dim=-1) @ V  # (1, H, n, D // H), tokens mixed
    wrong = heads.reshape(1, n, D) @ block.out_proj.weight.T + block.out_proj.bias  # (1, n, D)
    figures = released_model.text_mistakes(block, x, want, mask)
    assert abs(figures["split"] - (wrong - want).abs().max().item()) < 1e-12 and figures["split"] > 1e-3
    assert figures["split_shapes"] == [(1, H, n, D // H)] * 3 == [figures["right_split"]] * 3
    assert figures["merge_shape"] == figures["right_shape"] == (1, n, D) and figures["right"] == 0.0
    Q, K = ((x @ W + b).view(1, n, H, D // H).transpose(1, 2) for W, b in ((W_Q, b_Q), (W_K, b_K)))
    unscaled = (Q @ K.transpose(-2, -1)).masked_fill(~mask, float("-inf"))  # (1, H, n, n), right split
    no_scale = figures["no_scale_weights"]  # (H, n, n)
    assert torch.allclose(no_scale, torch.softmax(unscaled, dim=-1)[0])
    assert (no_scale.amax(dim=-1) >= figures["weights"].amax(dim=-1) - 1e-12).all()  # sharper, every row


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--query-token", "cat"], "error: --query-token cat: not a piece of the source; its pieces: ['▁"),
        (["--layer", "2"], "error: --layer 2: the model has 2 decoder layers, 0 to 1 (or -2 to -1 from"),
        (["--encoder-layer", "-3"], "error: --encoder-layer -3: the model has 2 encoder layers, 0 to 1"),
        (["--cross-layer", "2"], "error: --cross-layer 2: the model has 2 decoder layers, 0 to 1 (or -2 to"),
        (
            ["--target-token", "Katze"],
            "error: --target-token Katze: not a piece of the decoder's input; its "
            "pieces: ['<pad>', '▁Zwei', '▁j', 'unge', ",
        ),
    ],
)
def test_what_the_model_cannot_answer_is_a_one_line_error(argv, message, capsys):
    assert released_model.main(["--model", "random", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_offline_hub_name_falls_back_loudly_and_greedy_equals_generate(monkeypatch, capsys):
    monkeypatch.setattr(released_model, "hub_reachable", lambda timeout=3.0: False)
    argv = ["--model", "hf:Helsinki-NLP/no-such-model-here", "--source", "A dog runs in the park.",
            "--dtype", "float64"]  # fmt: skip
    assert released_model.main(argv) == 0
    captured = capsys.readouterr()
    assert "FALLING BACK TO A RANDOM SEEDED MARIAN MODEL" in captured.out
    assert "FALLING BACK" in captured.err
    assert "(our greedy translation; generate(num_beams=1) gives the same: yes)" in captured.out
    for output, weights in table(section(captured.out, 1), 2).values():
        assert output <= 1e-12 and weights <= 1e-12


def test_a_missing_local_folder_is_an_error(tmp_path, capsys):
    assert released_model.main(["--model", str(tmp_path / "none")]) == 1
    assert "not a folder" in capsys.readouterr().err


def test_the_mistakes_are_the_only_change():
    """With no mistake named, lesson/mistakes.py's attention is the package's: each figure is the
    mistake's."""
    block = MultiHeadAttention(16, 4).double().eval()
    x, memory = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    want = block(x, memory, memory, mask)[0]
    got, _ = mistakes.multi_head_with(block, x, memory, mask, "cross")
    assert (got - want).abs().max() < 1e-12
    for mistake in mistakes.MISTAKES:
        wrong, _ = mistakes.multi_head_with(block, x, memory, mask, "cross", mistake)
        assert (wrong - want).abs().max() > 1e-3, mistake
