"""bench/released_model.py on its random seeded fallback (the Hub is never contacted): the four parts are
printed, our attention equals Marian's block for block, and each classic mistake is far off."""

import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import released_model  # noqa: E402

BLOCKS = ["encoder.0.self", "encoder.1.self", "decoder.0.self", "decoder.0.cross", "decoder.1.self",
          "decoder.1.cross"]  # fmt: skip
NUMBER = r"(\d\.\d\de[+-]\d\d)"


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


def test_walk_through_on_the_random_model(capsys):
    assert released_model.main(["--model", "random"]) == 0
    out = capsys.readouterr().out
    assert "RANDOM Marian, opus-mt-en-de layout, reduced size" in out
    assert "(given, teacher-forced)" in out and "+ 3 × <pad>" in out
    blocks = table(section(out, 1), 2)
    assert list(blocks) == BLOCKS
    for name, (output, weights) in blocks.items():
        assert output <= 1e-5 and weights <= 1e-6, name  # float32; in fact bit-identical here
    heads = section(out, 2).splitlines()
    assert heads[1].split() == ["target"] + [w for h in range(8) for w in ("head", str(h))]
    assert len(heads) >= 2 + 8 and heads[2].startswith("▁Zwei")  # a row per target piece, then EOS
    alignment = section(out, 3)
    targets = re.findall(r"^(\d+):(\S+)", alignment, re.M)
    assert [w for _, w in targets] == ["Zwei", "junge", "Hunde", "spielen", "im", "Schnee."]
    assert re.search(r"pharaoh \(source-target\): (\d+-\d+ ?)+$", alignment, re.M)
    mistakes = table(section(out, 4), 4)
    assert list(mistakes) == BLOCKS
    for name, (ours, no_scale, after_softmax, no_transpose) in mistakes.items():
        assert ours <= 1e-5, name
        assert min(no_scale, after_softmax, no_transpose) > 0.1, name


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
    """With no mistake named, the script's own attention is the package's, so each figure is the mistake's."""
    module = released_model.MultiHeadAttention(16, 4).double().eval()
    x, memory = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    want = module(x, memory, memory, mask)[0]
    got = released_model.attention_with(module, x, memory, memory, mask, "none")
    assert (got - want).abs().max() < 1e-12
    for mistake in released_model.MISTAKES:
        assert (
            released_model.attention_with(module, x, memory, memory, mask, mistake) - want
        ).abs().max() > 1e-3
