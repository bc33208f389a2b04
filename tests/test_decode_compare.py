"""bench/decode_speed.py --compare on the tiny checkpoint: ours, transformers generate() and CTranslate2
(fp32, int8) decode the same 16 sentences in the same batches, and greedy outputs agree line for line."""

import re
import sys
from pathlib import Path

import pytest
from conftest import DATA_DIR

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import decode_speed  # noqa: E402

ENGINES = ["ours (cached greedy)", "transformers generate()", "CTranslate2 float32", "CTranslate2 int8"]
LINE = r"^\s*{}: +[\d.]+ s +([\d.]+) sentences/s  BLEU +[\d.]+  lines differing from ours: (\d+) of 16"


def test_compare_smoke(tiny_checkpoint, tmp_path, capsys):
    argv = ["--compare", "--checkpoint", str(tiny_checkpoint), "--data-dir", str(DATA_DIR), "--limit", "16",
            "--max-tokens", "300", "--export-dir", str(tmp_path)]  # fmt: skip
    assert decode_speed.main(argv) == 0
    out = capsys.readouterr().out
    found = {}
    for name in ENGINES:
        match = re.search(LINE.format(re.escape(name)), out, re.M)
        assert match, f"no line for {name}:\n{out}"
        found[name] = float(match.group(1)), int(match.group(2))
    # several batches of mixed lengths: each engine's one limit per batch, then each sentence's own cut
    assert found["transformers generate()"][1] == 0 and found["CTranslate2 float32"][1] == 0
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "ct2" / "model.bin").is_file()
    last = out.strip().splitlines()[-1]
    ratio = float(re.fullmatch(r"ratio_vs_hf=([\d.]+)", last).group(1))
    ours, hf = found["ours (cached greedy)"][0], found["transformers generate()"][0]
    assert ratio == pytest.approx(ours / hf, rel=0.05, abs=0.01)


def test_sentence_limits_and_cut_are_ours():
    assert decode_speed.sentence_limits([[5, 6], [], [7] * 100], 3, 50) == [6, 4, 50]
    assert decode_speed.cut([5, 6, 3, 0, 0], 4, eos_id=3) == [5, 6]  # ended before its limit
    assert decode_speed.cut([5, 6, 7, 8, 3], 3, eos_id=3) == [5, 6, 7]  # ran on: cut at its own limit
