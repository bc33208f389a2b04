"""bench/decode_speed.py --compare on the tiny checkpoint: ours (fp32, int8, int8-bf16, bf16), transformers
generate() and CTranslate2 (fp32, int8) decode the same 16 sentences in the same batches, greedy and with 4
beams; fp32 greedy outputs agree line for line, and the ratio lines are the sentences/s printed above
them."""

import re

import pytest

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
import decode_speed
from helpers import DATA_DIR

ENGINES = ["ours (cached greedy)", "ours int8 (cached greedy)", "ours int8-bf16 (cached greedy)",
           "ours bf16 (cached greedy)",
           "transformers generate()", "CTranslate2 float32", "CTranslate2 int8", "ours beam 4",
           "transformers generate() beam 4", "CTranslate2 float32 beam 4"]  # fmt: skip
LINE = r"^\s*{}: +[\d.]+ s +([\d.]+) sentences/s  BLEU +[\d.]+  lines differing from (.+?): (\d+) of 16"
RATIOS = {"bf16_vs_ct2_int8": ("ours bf16 (cached greedy)", "CTranslate2 int8"),
          "int8_bf16_vs_ct2_int8": ("ours int8-bf16 (cached greedy)", "CTranslate2 int8"),
          "vs_hf": ("ours (cached greedy)", "transformers generate()"),
          "vs_ct2": ("ours (cached greedy)", "CTranslate2 float32"),
          "int8_vs_ct2_int8": ("ours int8 (cached greedy)", "CTranslate2 int8"),
          "beam4_vs_hf": ("ours beam 4", "transformers generate() beam 4"),
          "beam4_vs_ct2": ("ours beam 4", "CTranslate2 float32 beam 4")}  # fmt: skip


def test_compare_smoke(tiny_checkpoint, tmp_path, capsys):
    argv = ["--compare", "--checkpoint", str(tiny_checkpoint), "--data-dir", str(DATA_DIR), "--limit", "16",
            "--max-tokens", "300", "--rounds", "2", "--export-dir", str(tmp_path)]  # fmt: skip
    assert decode_speed.main(argv) == 0
    out = capsys.readouterr().out
    found = {}
    for name in ENGINES:
        match = re.search(LINE.format(re.escape(name)), out, re.M)
        assert match, f"no line for {name}:\n{out}"
        found[name] = float(match.group(1)), match.group(2), int(match.group(3))
    # several batches of mixed lengths: each engine's one limit per batch, then each sentence's own cut
    assert found["transformers generate()"][1:] == ("ours (cached greedy)", 0)
    assert found["CTranslate2 float32"][1:] == ("ours (cached greedy)", 0)
    assert found["transformers generate() beam 4"][1] == "ours beam 4"
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "ct2" / "model.bin").is_file()
    last = out.strip().splitlines()[-len(RATIOS) :]
    assert [line.split("=")[0] for line in last] == [f"ratio_{name}" for name in RATIOS]
    for line, (mine, theirs) in zip(last, RATIOS.values()):
        ratio = float(re.fullmatch(r"ratio_\w+=([\d.]+)", line).group(1))
        assert ratio == pytest.approx(found[mine][0] / found[theirs][0], rel=0.05, abs=0.01), line


def test_sentence_limits_and_cut_are_ours():
    assert decode_speed.sentence_limits([[5, 6], [], [7] * 100], 3, 50) == [6, 4, 50]
    assert decode_speed.cut([5, 6, 3, 0, 0], 4, eos_id=3) == [5, 6]  # ended before its limit
    assert decode_speed.cut([5, 6, 7, 8, 3], 3, eos_id=3) == [5, 6, 7]  # ran on: cut at its own limit


def test_ctranslate2_worker_reports_a_bad_model_folder_by_name(tmp_path):
    from ct2_worker import CTranslate2Process

    with pytest.raises(RuntimeError, match=r"CTranslate2 worker .*RuntimeError: .*nowhere"):
        CTranslate2Process(tmp_path / "nowhere", "cpu", ["float32"], threads=1)


def test_ctranslate2_worker_decodes_without_torch_in_its_process(tiny_checkpoint, tmp_path):
    """The worker exists so that CTranslate2 and PyTorch never share a process (ct2_worker.py: why); its
    process ends with the ``with``. (That its answers come back in order: test_compare_smoke.)"""
    from ct2_worker import CTranslate2Process

    from transformer.interop.marian import export

    export(tiny_checkpoint, tmp_path / "hf", tmp_path / "ct2")
    with CTranslate2Process(tmp_path / "ct2", "cpu", ["float32"], threads=1) as worker:
        assert worker.torch_loaded is False
        batches = [[["▁a", "</s>"]], [["▁b", "</s>"], ["</s>"]]]
        hypotheses, seconds = worker.translate("float32", batches, [3, 2], beam=1, length_penalty=0.6)
    assert worker.process.returncode == 0
    assert len(hypotheses) == 3 and seconds > 0
