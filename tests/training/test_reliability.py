"""Faults: SIGKILL then --resume, broken checkpoints, non-finite losses, degenerate batches, bad setups."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import DATA_DIR, ROOT, needs_data

from transformer.commands import train
from transformer.core.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from transformer.core.config import ModelConfig
from transformer.core.model import Transformer
from transformer.training.run_folder import link_checkpoint

TINY = str(ROOT / "transformer/configs/tiny.yaml")
COMMON = ["eval.every_steps=0", "train.checkpoint_every=2", "train.max_steps=16"]


def argv(run_dir: Path, *overrides: str) -> list[str]:
    out = ["--config", TINY, "--run-dir", str(run_dir), "--data-dir", str(DATA_DIR)]
    return out + [f"--set={o}" for o in overrides]


def checkpoint_step(path: Path) -> int:
    try:
        return load_checkpoint(path)["state"]["step"]
    except CheckpointError:
        return -1


@needs_data
def test_sigkill_then_resume_ends_bit_identical(tmp_path):
    """Every stage in a process of its own with the same thread count: bit-identity on CPU holds for the
    same float reduction order, which the number of threads changes."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    train_py = [sys.executable, str(ROOT / "train.py")]
    quiet = {"cwd": ROOT, "env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    steps = "train.max_steps=80"  # tiny steps are fast: leave the kill below room to land mid-run
    # the straight run beside the one to kill: one thread each, so the 2 cores run both
    straight_run = subprocess.Popen(train_py + argv(straight, *COMMON, steps), **quiet)
    proc = subprocess.Popen(train_py + argv(killed, *COMMON, "train.max_steps=100000"), **quiet)
    deadline = time.time() + 240
    while checkpoint_step(killed / "last.pt") < 6 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # in the middle of training, no chance to clean up
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert 6 <= checkpoint_step(killed / "last.pt") < 80
    assert straight_run.wait(timeout=240) == 0

    assert subprocess.run(train_py + argv(killed, *COMMON, steps) + ["--resume"], **quiet).returncode == 0
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(killed / "last.pt")
    assert a["state"]["step"] == b["state"]["step"] == 80
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), f"{name} differs after resume"
    for key in ("exp_avg", "exp_avg_sq"):
        for i, s in a["optimizer"]["state"].items():
            assert torch.equal(s[key], b["optimizer"]["state"][i][key])


def test_truncated_or_corrupted_checkpoint_is_a_clear_error(tmp_path):
    good = tmp_path / "good.pt"
    save_checkpoint({"config": {}, "model": {"w": torch.ones(1000)}, "tokenizer": torch.zeros(3)}, good)
    data = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all" * 10)
    (tmp_path / "empty.pt").write_bytes(b"")
    for name in ("truncated.pt", "garbage.pt", "empty.pt"):
        with pytest.raises(CheckpointError, match=rf"{name} is truncated or corrupted"):
            load_checkpoint(tmp_path / name)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoint_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"config": {}, "model": {}, "tokenizer": Evil()}, path)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(path)


def test_last_checkpoint_is_never_half_written(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)

    def crash(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise KeyboardInterrupt  # killed in the middle of writing

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left behind


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_linked_checkpoint_keeps_its_bytes_when_the_source_is_saved_over(tmp_path, monkeypatch, hard_links):
    """best.pt is written as a link to last.pt; the next last.pt must not change it."""
    if not hard_links:
        monkeypatch.setattr(os, "link", lambda *args: (_ for _ in ()).throw(OSError("no hard links here")))
    last, best = tmp_path / "last.pt", tmp_path / "best.pt"
    save_checkpoint({"step": 1}, best)
    save_checkpoint({"step": 2}, last)
    link_checkpoint(last, best)  # replaces the older best.pt
    assert torch.load(best, weights_only=True) == {"step": 2}
    save_checkpoint({"step": 3}, last)
    assert torch.load(best, weights_only=True) == {"step": 2}
    assert torch.load(last, weights_only=True) == {"step": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]  # no temporary file left


@needs_data
def test_resume_from_truncated_last_is_a_one_line_error(tmp_path, capsys):
    assert train.main(argv(tmp_path / "run", "eval.every_steps=0", "train.max_steps=2")) == 0
    last = tmp_path / "run" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    assert train.main(argv(tmp_path / "run") + ["--resume"]) == 1
    err = capsys.readouterr().err
    assert "last.pt is truncated or corrupted" in err and "Traceback" not in err


def nan_after(step: int, monkeypatch):
    """Make the training loss NaN from optimizer update ``step`` on."""
    real = train.output_loss
    calls = {"n": 0}

    def loss(*args, **kwargs):
        calls["n"] += 1
        value = real(*args, **kwargs)
        return value * float("nan") if calls["n"] >= step and torch.is_grad_enabled() else value

    monkeypatch.setattr(train, "output_loss", loss)


@needs_data
def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    nan_after(7, monkeypatch)
    run_dir = tmp_path / "run"
    assert train.main(argv(run_dir, *COMMON)) == 1
    err = capsys.readouterr().err
    assert "non-finite loss" in err and "step 7" in err and "last.pt" in err
    good = load_checkpoint(run_dir / "last.pt")
    assert good["state"]["step"] == 6
    assert all(torch.isfinite(t).all() for t in good["model"].values())


@needs_data
@pytest.mark.parametrize(
    ("nan_from", "checkpoint_every", "caught_at", "last_good"),
    [(7, 5, 8, 5), (5, 3, 6, 3)],  # caught by the check every 4 steps; caught by the check before a save
)
def test_a_deferred_nonfinite_check_stops_within_sync_every_steps(
    tmp_path, monkeypatch, capsys, nan_from, checkpoint_every, caught_at, last_good
):
    """train.sync_every = 4 (no host sync per step, as on a GPU): the NaN update is applied, then caught at
    the next check (every 4 steps, or before any checkpoint, whichever comes first), never saved."""
    nan_after(nan_from, monkeypatch)
    run_dir = tmp_path / "run"
    settings = (*COMMON, "train.sync_every=4", f"train.checkpoint_every={checkpoint_every}")
    assert train.main(argv(run_dir, *settings)) == 1
    err = capsys.readouterr().err
    assert "non-finite loss" in err and f"step {caught_at} or before" in err and "last.pt" in err
    good = load_checkpoint(run_dir / "last.pt")
    assert good["state"]["step"] == last_good
    assert all(torch.isfinite(t).all() for t in good["model"].values())


@needs_data
def test_nonfinite_loss_can_skip_the_update(tmp_path, monkeypatch, capsys):
    real = train.output_loss
    calls = {"n": 0}

    def loss(*args, **kwargs):  # only the 5th batch is poisoned
        calls["n"] += 1
        value = real(*args, **kwargs)
        return value * float("nan") if calls["n"] == 5 else value

    monkeypatch.setattr(train, "output_loss", loss)
    run_dir = tmp_path / "run"
    assert train.main(argv(run_dir, *COMMON, "train.nonfinite_loss=skip", "train.max_steps=8")) == 0
    assert "skipping step 5" in capsys.readouterr().err
    final = load_checkpoint(run_dir / "last.pt")
    assert final["state"]["step"] == 8
    assert all(torch.isfinite(t).all() for t in final["model"].values())


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_degenerate_batches_give_no_nan(dtype):
    torch.manual_seed(0)
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2)
    model = Transformer(config, 30, 30, pad_id=0, bos_id=2, eos_id=3).train()
    src = torch.zeros(4, 9, dtype=torch.long)
    src[0, :] = torch.randint(4, 30, (9,))  # one real sentence...
    src[1, 0] = 5  # ...a source of length 1; rows 2 and 3 are all padding
    tgt_in = torch.zeros(4, 5, dtype=torch.long)
    tgt_in[:, 0] = 2  # BOS everywhere
    tgt_in[0, 1:] = torch.randint(4, 30, (4,))
    tgt_out = torch.zeros_like(tgt_in)
    tgt_out[:2, 0] = 3
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits = model(src, tgt_in)
    assert torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=0)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@needs_data
def test_unwritable_run_folder_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert train.main(argv(blocker / "run", "train.max_steps=1")) == 1
    assert "cannot write to run folder" in capsys.readouterr().err


def test_missing_data_is_a_clear_error_and_leaves_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["--config", TINY, "--run-dir", str(run_dir), "--data-dir", str(tmp_path / "nowhere")]
    assert train.main(args) == 1
    err = capsys.readouterr().err
    assert "nowhere" in err and "Traceback" not in err
    assert not run_dir.exists()


def test_bad_config_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_modell: 3\n")
    assert train.main(["--config", str(bad), "--run-dir", str(tmp_path / "run")]) == 1
    assert "unknown key model.d_modell" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@needs_data
def test_resume_at_an_epoch_end_keeps_the_pending_micro_batches(tmp_path):
    """train.accum_steps=2 over an epoch of an odd number of batches: the epoch's last batch waits for the
    next epoch's first. A run stopped at the epoch end (max_epochs=1) and resumed (max_epochs=2) must end
    as the run that never stopped; it used to drop that last batch (the saved state was the next epoch's
    start)."""
    common = ["eval.every_steps=0", "train.max_steps=0", "train.accum_steps=2", "data.train_limit=310"]  # 41
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert train.main(argv(straight, *common, "train.max_epochs=2")) == 0
    first = load_checkpoint(straight / "last.pt")["state"]
    assert train.main(argv(stopped, *common, "train.max_epochs=1")) == 0
    middle = load_checkpoint(stopped / "last.pt")["state"]
    assert middle["step"] * 2 < first["step"], "the epoch must end with a pending micro-batch"  # odd epoch
    assert (middle["epoch"], middle["pending_from"]) == (1, [0, 40])  # honest epoch; where --resume reads
    assert train.main(argv(stopped, *common, "train.max_epochs=1") + ["--resume"]) == 0  # nothing left to do
    assert load_checkpoint(stopped / "last.pt")["state"]["step"] == middle["step"]
    assert train.main(argv(stopped, *common, "train.max_epochs=2") + ["--resume"]) == 0
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(stopped / "last.pt")
    assert (
        a["state"]["step"] == b["state"]["step"] and a["state"]["train_tokens"] == b["state"]["train_tokens"]
    )
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), f"{name} differs after resume"
