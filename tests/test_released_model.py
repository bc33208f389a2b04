"""bench/released_model.py on its random seeded fallback (the Hub is never contacted): the seven parts are
printed, our attention equals Marian's block for block, the plain formula differs by float32 rounding only,
no decoder row sees the future, rows say what they read and predict, and each classic mistake is far off."""

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest
import torch

from transformer.attention import MultiHeadAttention

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import mistakes  # noqa: E402
import released_model  # noqa: E402

BLOCKS = ["encoder.0.self", "encoder.1.self", "decoder.0.self", "decoder.0.cross", "decoder.1.self",
          "decoder.1.cross"]  # fmt: skip
LAYER_0 = ["encoder.0.self", "decoder.0.self", "decoder.0.cross"]
NUMBER = r"(\d\.\d\de[+-]\d\d)"
# The reference the random fallback teacher-forces, as its SentencePiece pieces, then EOS.
PREDICTED = ["▁Zwei", "▁j", "unge", "▁H", "unde", "▁spielen", "▁im", "▁Sch", "nee", ".", "</s>"]


def run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert released_model.main(argv) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def default_run() -> str:
    """`python bench/released_model.py --model random`, printed once for the tests of this file."""
    return run(["--model", "random"])


def section(output: str, number: int) -> str:
    return output.split(f"== {number}.")[1].split("\n== ")[0]


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
    assert len(heads) == 2 + len(PREDICTED)  # a row per decoder position, EOS's included
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


def test_encoder_heads_for_a_query_token():
    pieces = ["▁Two", "▁yo", "ung", "▁d", "ogs", "▁are", "▁playing", "</s>"]
    assert released_model.query_position(pieces, None) == 6  # the longest word start
    assert released_model.query_position(pieces, "d") == released_model.query_position(pieces, "▁d") == 3
    assert released_model.query_position(pieces, "ogs") == 4
    out = run(["--model", "random", "--dtype", "float64", "--encoder-layer", "-1", "--query-token", "are",
               "--layer", "1"])  # fmt: skip
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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--query-token", "cat"], "error: --query-token cat: not a piece of the source; its pieces: ['▁"),
        (["--layer", "2"], "error: --layer 2: the model has 2 decoder layers, 0 to 1 (or -2 to -1 from"),
        (["--encoder-layer", "-3"], "error: --encoder-layer -3: the model has 2 encoder layers, 0 to 1"),
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
    """With no mistake named, bench/mistakes.py's attention is the package's: each figure is the mistake's."""
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
