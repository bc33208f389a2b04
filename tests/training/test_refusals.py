"""A refused run leaves its run folder as it was, and resuming or fine-tuning goes on from the right
weights: every refusal comes before anything is written; ``init_from`` with ``reset_optimizer: false``
continues the raw weights and the moving average, as ``--resume`` does; a checkpoint that does not record
its precision trained in fp32; ranks that disagree on the precision get a one-line error."""

import hashlib
from pathlib import Path

import torch
from helpers import cpu_with, needs_data, run_train

from transformer.core.checkpoint import load_checkpoint, save_checkpoint
from transformer.training.ranks import Runtime


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: its SHA-256, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@needs_data
def test_a_refused_resume_leaves_the_run_folder_byte_identical(tmp_path, monkeypatch, capsys):
    steps = ("train.precision=auto", "eval.every_steps=0")
    cpu_with(monkeypatch, "avx512_bf16")
    assert run_train(tmp_path / "run", *steps, "train.max_steps=2") == 0
    before = snapshot(tmp_path / "run")
    cpu_with(monkeypatch)  # auto is fp32 here: another precision
    assert run_train(tmp_path / "run", *steps, "train.max_steps=4", resume=True) == 1
    assert "was trained in bf16" in capsys.readouterr().err
    assert run_train(tmp_path / "run", *steps, "train.max_steps=4", "model.d_ff=48", resume=True) == 1
    assert "other values of model.d_ff" in capsys.readouterr().err
    assert snapshot(tmp_path / "run") == before


@needs_data
def test_a_checkpoint_without_a_precision_trained_in_fp32(tmp_path, monkeypatch, capsys):
    assert run_train(tmp_path / "run", "train.precision=fp32", "eval.every_steps=0", "train.max_steps=2") == 0
    last = tmp_path / "run" / "last.pt"
    checkpoint = load_checkpoint(last)
    checkpoint["state"]["precision"] = None  # as checkpoints written before it was recorded
    save_checkpoint(checkpoint, last)
    cpu_with(monkeypatch, "avx512_bf16")  # auto is bf16 here
    assert run_train(tmp_path / "run", "train.precision=auto", "train.max_steps=4", resume=True) == 1
    assert "was trained in fp32" in capsys.readouterr().err


@needs_data
def test_init_from_without_optimizer_state_is_refused_before_the_run_folder_is_written(
    tiny_checkpoint, tmp_path, capsys
):
    inference_only = {
        k: v for k, v in load_checkpoint(tiny_checkpoint).items() if k in ("config", "model", "tokenizer")
    }
    save_checkpoint(inference_only, tmp_path / "weights.pt")
    source = f"train.init_from={tmp_path / 'weights.pt'}"
    assert run_train(tmp_path / "run", source, "train.reset_optimizer=false") == 1
    assert "needs the source's optimizer state" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert (
        run_train(tmp_path / "run", source, "train.max_steps=2", "eval.every_steps=0") == 0
    )  # not "holds a run"


@needs_data
def test_init_from_without_reset_continues_the_raw_weights_and_the_moving_average(tmp_path):
    ema = ("train.ema_decay=0.9", "eval.every_steps=0")
    assert run_train(tmp_path / "source", *ema, "train.max_steps=4") == 0
    source = load_checkpoint(tmp_path / "source" / "last.pt")
    assert not torch.equal(source["model"]["output_proj.weight"], source["train_model"]["output_proj.weight"])
    keep = (f"train.init_from={tmp_path / 'source' / 'last.pt'}", "train.reset_optimizer=false")
    assert run_train(tmp_path / "tuned", *ema, *keep, "train.max_steps=4") == 0  # no update left: as it was
    tuned = load_checkpoint(tmp_path / "tuned" / "last.pt")
    assert tuned["state"]["step"] == 4
    for name, weight in source["train_model"].items():  # the raw weights, not the average, go on training
        assert torch.equal(tuned["train_model"][name], weight), name
    for name, weight in source["model"].items():  # and the average goes on from where it was
        assert torch.equal(tuned["model"][name], weight), name
    assert tuned["ema"]["updates"] == source["ema"]["updates"]


@needs_data
def test_ranks_that_resolve_the_precision_differently_get_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Runtime, "gather", lambda self, obj: [obj, "bf16" if obj == "fp32" else "fp32"])
    assert run_train(tmp_path / "run", "train.precision=auto") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: train.precision=auto resolves differently") and "Traceback" not in err
    assert not (tmp_path / "run").exists()
