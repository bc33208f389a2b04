"""The training paths this machine rarely takes, pinned: gradient accumulation, label smoothing over the
tokens the decoder can produce, reruns into an existing run folder, long validation sentences, early
stopping, checkpoint averaging, torch.compile, and data parallelism (torchrun, 2 CPU processes)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import sacrebleu
import torch
import torch.nn.functional as F
from helpers import DATA_DIR, ROOT, needs_data, run_train

from transformer.commands import train
from transformer.core.batches import collate
from transformer.core.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from transformer.core.config import ModelConfig, TrainConfig
from transformer.core.loss import token_loss
from transformer.core.model import Transformer
from transformer.runtime.checkpoints import load_for_inference
from transformer.training import averaging
from transformer.training.averaging import average_checkpoints, average_last, step_checkpoints
from transformer.training.averaging import main as average_main
from transformer.training.ranks import Runtime

# -------- gradient accumulation -------------------------------------------------------------------


def toy_run(accum_steps: int) -> SimpleNamespace:
    """What ``train.accumulate_gradients`` reads of a Run, around a small dropout-free model."""
    torch.manual_seed(0)
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)
    model = Transformer(config, 30, 30, pad_id=0, bos_id=2, eos_id=3)
    return SimpleNamespace(
        runtime=Runtime(torch.device("cpu"), None),
        config=SimpleNamespace(train=TrainConfig(accum_steps=accum_steps, label_smoothing=0.1)),
        never_produced=[0, 2],
        model=model,
        tokenizer=SimpleNamespace(pad_id=0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        state=SimpleNamespace(train_tokens=0),
    )


def test_two_accumulated_half_batches_give_the_full_batch_update():
    """The update's loss is the sum over all target tokens / their count (fairseq), not a mean of the
    micro-batches' means: the two halves here hold very different numbers of tokens."""
    generator = torch.Generator().manual_seed(1)
    lengths = [2, 3, 2, 14, 15, 16]  # short sentences in the first half, long ones in the second
    pairs = [(torch.randint(4, 30, (n,), generator=generator).tolist(),) * 2 for n in lengths]
    full, halves = toy_run(1), toy_run(2)
    full_loss = train.accumulate_gradients(full, full.model, [collate(pairs, range(6), 0, 2, 3)])
    parts = [collate(pairs[:3], range(3), 0, 2, 3), collate(pairs[3:], range(3, 6), 0, 2, 3)]
    halves_loss = train.accumulate_gradients(halves, halves.model, parts)
    torch.testing.assert_close(halves_loss, full_loss, rtol=1e-6, atol=0)  # the whole update's loss
    for (name, a), b in zip(full.model.named_parameters(), halves.model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
    assert full.state.train_tokens == halves.state.train_tokens == sum(n + 1 for n in lengths)


# -------- label smoothing -------------------------------------------------------------------------


def test_label_smoothing_spreads_only_over_tokens_the_decoder_can_produce():
    """By hand: (1 - ε)·(-log p_y) + ε·mean over the V' producible tokens of (-log p_v), PAD positions out."""
    logits = torch.tensor([[[2.0, 0.5, 1.0, -1.0, 0.0], [0.3, 0.2, 0.1, 0.0, -0.1]]])  # (1, 2, V=5)
    tgt_out = torch.tensor([[3, 0]])  # the second position is padding
    eps, pad, bos = 0.1, 0, 2
    log_p = torch.log_softmax(logits[0, 0], dim=-1)
    producible = [1, 3, 4]  # not PAD, not BOS
    expected = (1 - eps) * -log_p[3] + eps * -log_p[producible].mean()
    got = token_loss(logits, tgt_out, pad, eps, never_produced=[pad, bos])
    torch.testing.assert_close(got, expected)
    # PyTorch's own label smoothing spreads over all V tokens, PAD and BOS included: a different number
    everywhere = F.cross_entropy(
        logits[0], tgt_out[0], ignore_index=pad, label_smoothing=eps, reduction="sum"
    )
    assert not torch.isclose(got, everywhere)


# -------- the run folder --------------------------------------------------------------------------


@needs_data
def test_a_fresh_run_into_a_used_folder_is_refused_and_overwrite_starts_clean(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_train(run_dir, "eval.every_steps=0", "train.max_steps=2") == 0
    before = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run_train(run_dir, "eval.every_steps=0", "train.max_steps=2") == 1
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--run-dir" in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # untouched
    assert run_train(run_dir, "eval.every_steps=0", "train.max_steps=3", flags=("--overwrite",)) == 0
    events = sorted(run_dir.glob("events.*"))
    assert len(events) == 1 and events[0].name not in before  # one fresh event file, not appended
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 3


@needs_data
def test_a_refused_run_leaves_its_folder_as_it_was_overwrite_included(tmp_path, capsys):
    """data.max_len=1 leaves no training pair, which shows only once the tokenizer is there: the old run of
    --overwrite must come back whole, and a fresh folder must not keep what the refused run wrote."""
    run_dir = tmp_path / "run"
    assert run_train(run_dir, "eval.every_steps=0", "train.max_steps=2") == 0
    files = lambda: {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}  # noqa: E731
    before = files()
    capsys.readouterr()
    assert run_train(run_dir, "data.max_len=1", "train.max_steps=2", flags=("--overwrite",)) == 1
    assert "no training pair is left" in capsys.readouterr().err
    assert files() == before and {"best.pt", "last.pt", "results.json"} <= {p.name for p in before}
    fresh = tmp_path / "fresh"
    assert run_train(fresh, "data.max_len=1", "train.max_steps=2") == 1
    assert not fresh.exists()  # no config.yaml or tokenizer.model left to refuse the corrected rerun
    assert run_train(fresh, "eval.every_steps=0", "train.max_steps=2") == 0


# -------- validation and test sentences longer than the model allows ------------------------------


@needs_data
def test_long_validation_and_test_sources_are_truncated_with_a_warning(tmp_path, capsys):
    """model.max_positions=24 with eval.max_len_offset=10 leaves 13 source tokens: many Multi30k sentences
    are longer (the training filter data.max_len keeps training pairs within the table)."""
    small = ("model.max_positions=24", "data.max_len=23", "train.max_steps=2", "eval.every_steps=0")
    with pytest.warns(UserWarning, match=r"\d+ validation sources longer than 13 tokens truncated"):
        assert run_train(tmp_path / "run", *small) == 0
    assert json.loads((tmp_path / "run" / "results.json").read_text())["steps"] == 2


# -------- results that say something --------------------------------------------------------------


@needs_data
def test_results_are_the_scores_of_the_written_hypotheses(tmp_path):
    assert run_train(tmp_path / "run", "eval.every_steps=0", "train.max_steps=4") == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    hypotheses = (tmp_path / "run" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    from transformer.training.multi30k import load_multi30k

    references = load_multi30k("de", "en", DATA_DIR)["test"].tgt[:24]
    assert results["test_bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert results["train_tokens_per_s"] == pytest.approx(
        results["train_tokens"] / (60 * results["train_minutes"])
    )


# -------- early stopping, checkpoint averaging ----------------------------------------------------


@needs_data
def test_patience_stops_when_the_selected_metric_stops_improving(tmp_path):
    """With a learning rate too small to change anything, validation BLEU never rises above the first."""
    frozen = ("train.peak_lr=1.0e-12", "train.max_steps=30", "eval.every_steps=2", "train.patience=2")
    assert run_train(tmp_path / "run", *frozen) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["stopped_by"] == "patience" and results["steps"] == 6  # evaluations at 2 (best), 4, 6
    assert results["best_step"] == 2


@needs_data
def test_keep_last_and_average_last(tmp_path, capsys):
    run_dir = tmp_path / "run"
    settings = ("train.max_steps=9", "eval.every_steps=3", "train.keep_last=2", "eval.average_last=2")
    assert run_train(run_dir, *settings) == 0
    kept = step_checkpoints(run_dir)
    assert [p.name for p in kept] == ["step_6.pt", "step_9.pt"]  # step_3.pt rotated out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["tested"] == "averaged.pt"
    a, b, averaged = (load_checkpoint(p)["model"] for p in (*kept, run_dir / "averaged.pt"))
    name = "decoder.layers.0.ffn.linear1.weight"
    torch.testing.assert_close(averaged[name], (a[name].double() + b[name].double()).div(2).float())
    assert not torch.equal(averaged[name], a[name])
    # the command line gives the same checkpoint, and translate.py's loader takes it
    assert average_main([str(tmp_path / "cli.pt"), "--last", "2", str(run_dir)]) == 0
    assert torch.equal(load_checkpoint(tmp_path / "cli.pt")["model"][name], averaged[name])
    load_for_inference(tmp_path / "cli.pt")
    assert average_main([str(tmp_path / "x.pt"), "--last", "3", str(run_dir)]) == 1
    assert "holds 2 step_<S>.pt checkpoints, not 3" in capsys.readouterr().err
    with pytest.raises(Exception, match="no checkpoints"):
        average_checkpoints([])


@needs_data
def test_averaging_with_a_moving_average_averages_the_raw_weights_unless_told(tmp_path, capsys):
    """With train.ema_decay > 0 the step checkpoints keep the raw weights beside the moving average, and
    averaging (§6.1) takes the raw ones by default: it used to average the moving-average snapshots."""
    run_dir = tmp_path / "run"
    settings = ("train.max_steps=9", "eval.every_steps=3", "train.keep_last=2", "eval.average_last=2",
                "train.ema_decay=0.9")  # fmt: skip
    assert run_train(run_dir, *settings) == 0
    a, b = (load_checkpoint(p) for p in step_checkpoints(run_dir))
    name = "decoder.layers.0.ffn.linear1.weight"
    mean = lambda key: (a[key][name].double() + b[key][name].double()).div(2).float()  # noqa: E731
    assert not torch.equal(a["train_model"][name], a["model"][name])  # raw and moving average both kept
    torch.testing.assert_close(load_checkpoint(run_dir / "averaged.pt")["model"][name], mean("train_model"))
    assert average_main([str(tmp_path / "ema.pt"), "--last", "2", str(run_dir), "--weights", "ema"]) == 0
    torch.testing.assert_close(load_checkpoint(tmp_path / "ema.pt")["model"][name], mean("model"))
    assert "averaged the ema weights of 2 checkpoints" in capsys.readouterr().out
    plain = tmp_path / "plain"  # no moving average: nothing to average but the raw weights
    assert run_train(plain, "train.max_steps=6", "eval.every_steps=3", "train.keep_last=2") == 0
    assert average_main([str(tmp_path / "x.pt"), "--last", "2", str(plain), "--weights", "ema"]) == 1
    assert "has no moving average" in capsys.readouterr().err


def test_checkpoints_that_kept_only_the_moving_average_are_averaged_as_such_with_a_warning(
    tmp_path, capsys, monkeypatch
):
    """Step checkpoints written before the raw weights were kept beside the moving average: averaging the
    raw weights cannot be done, so the final test averages the moving averages and says so, loading each
    checkpoint once."""
    config = {"model": {"d_model": 2}, "train": {"ema_decay": 0.9}}
    for step, value in ((3, 1.0), (6, 3.0)):
        checkpoint = {"config": config, "model": {"w": torch.full((2,), value)}, "tokenizer": torch.zeros(3)}
        save_checkpoint(checkpoint, tmp_path / f"step_{step}.pt")
    loaded = []
    monkeypatch.setattr(
        averaging, "load_checkpoint", lambda path: loaded.append(path) or load_checkpoint(path)
    )
    averaged = average_last(tmp_path, 2, "raw", has_ema=True)
    assert loaded == [tmp_path / "step_3.pt", tmp_path / "step_6.pt"]
    assert averaged == tmp_path / "averaged.pt"
    state = load_checkpoint(averaged)
    assert torch.equal(state["model"]["w"], torch.full((2,), 2.0))
    assert state["state"]["averaged_weights"] == "ema"
    assert "averaging their moving averages (eval.average_weights=ema)" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="holds only the moving average"):  # no switch without one
        average_last(tmp_path, 2, "raw", has_ema=False)


# -------- torch.compile -------------------------------------------------------------------------


@needs_data
def test_compile_trains_on_the_cpu(tmp_path):
    assert run_train(tmp_path / "run", "train.compile=true", "train.max_steps=2", "eval.every_steps=0") == 0
    assert json.loads((tmp_path / "run" / "results.json").read_text())["steps"] == 2


# -------- data parallelism ------------------------------------------------------------------------


@needs_data
def test_torchrun_ranks_stay_identical_and_match_one_process(tmp_path):
    """tests/training/ddp_check.py under torchrun (2 CPU processes, gloo): parameters identical across
    ranks after several steps of 2 micro-batches per rank (gradients averaged over the ranks after the last
    one only), disjoint shards, the loss and update of the single-process run on the same global batch, and
    (test_train.py's torchrun run) different dropout masks per rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "training" / "ddp_check.py"), str(tmp_path)]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "ddp_report.json").read_text())
    assert report["no_sync_entered"] == 3  # 3 updates, each accumulating its first micro-batch unsynced
    assert report["params_identical_across_ranks"] and report["shards_disjoint"]
    assert report["loss_rel_diff_vs_one_process"] < 1e-6 and report["param_max_diff_vs_one_process"] < 1e-6
