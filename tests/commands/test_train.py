"""train.py end to end on a slice of Multi30k: artefacts, resume, config errors; overfitting a tiny set."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import DATA_DIR, ROOT, TINY, cpu_with, needs_data, run_train

from transformer.core.batches import collate
from transformer.core.checkpoint import load_checkpoint
from transformer.core.config import ConfigError, ModelConfig, TrainConfig
from transformer.core.loss import token_loss
from transformer.core.model import Transformer
from transformer.core.optim import cooldown_factor, learning_rate, make_optimizer, set_lr
from transformer.runtime.configs import load_config
from transformer.training import validation
from transformer.training.corpus import read_lines
from transformer.training.resume import load_optimizer_state


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tiny_run")
    assert run_train(run_dir, heatmaps=True) == 0  # test_end_to_end_run_writes_every_artefact looks
    return run_dir


@needs_data
def test_end_to_end_run_writes_every_artefact(tiny_run):
    for name in ("config.yaml", "tokenizer.model", "last.pt", "best.pt", "results.json"):
        assert (tiny_run / name).is_file(), name
    results = json.loads((tiny_run / "results.json").read_text())
    assert results["steps"] == 12 and results["stopped_by"] == "max_steps"
    assert "tok:13a" in results["signature"]  # the BLEU itself: test_training_paths.py
    assert [e["step"] for e in results["validation"]] == [6, 12]
    hypotheses = (tiny_run / "test_hypotheses.txt").read_text(encoding="utf-8").split("\n")
    assert len(hypotheses) == 24 + 1  # eval_limit lines, each newline-terminated

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tiny_run), size_guidance={"images": 0, "tensors": 0}).Reload()
    tags = events.Tags()
    for scalar in ("train/loss", "train/lr", "train/tokens_per_s", "train/grad_norm", "val/bleu", "val/loss"):
        assert scalar in tags["scalars"], scalar
    for image in ("cross/layer_0", "cross/heads_layer_0", "encoder_self/layer_0", "decoder_self/layer_0"):
        assert f"sentence_0/{image}" in tags["images"], image
    assert any(t.startswith("val/translations") for t in tags["tensors"])
    hparams = EventAccumulator(str(tiny_run / "hparams"), size_guidance={"tensors": 0}).Reload()
    assert "hparam/test_bleu" in hparams.Tags()["scalars"]


@needs_data
def test_checkpoint_is_self_contained_and_safe(tiny_run):
    state = torch.load(tiny_run / "best.pt", weights_only=True)  # no pickled objects
    assert {"config", "model", "tokenizer", "optimizer", "state", "rng"} <= state.keys()
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])


@needs_data
def test_resume_after_stop_continues_exactly(tmp_path):
    """6 steps, stop, --resume to 12 == 12 steps straight: same parameters, bit for bit."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_train(straight, "eval.every_steps=0", "train.checkpoint_every=3") == 0
    assert run_train(resumed, "eval.every_steps=0", "train.max_steps=6") == 0
    assert run_train(resumed, "eval.every_steps=0", "train.max_steps=12", resume=True) == 0
    a = load_checkpoint(straight / "last.pt")
    b = load_checkpoint(resumed / "last.pt")
    assert a["state"]["step"] == b["state"]["step"] == 12
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert a["state"]["train_tokens"] == b["state"]["train_tokens"]


@needs_data
def test_a_resume_with_a_new_budget_goes_on_and_says_what_it_changes(tmp_path, capsys):
    assert run_train(tmp_path / "run", "eval.every_steps=0", "train.max_steps=3") == 0
    assert run_train(tmp_path / "run", "eval.every_steps=0", "train.max_steps=3", resume=True) == 0
    assert "resuming with" not in capsys.readouterr().out  # the budget spent: nothing changes, it stops
    assert load_checkpoint(tmp_path / "run" / "last.pt")["state"]["step"] == 3
    assert run_train(tmp_path / "run", "eval.every_steps=0", "train.max_steps=5", resume=True) == 0
    out = capsys.readouterr().out
    checks = "a resume checks only model.*, variant.*, train.seed and data.* but data.data_dir, "
    checks += "data.cache_dir, data.workers"
    assert f"resuming with train.max_steps (3 -> 5) ({checks})" in out
    assert load_checkpoint(tmp_path / "run" / "last.pt")["state"]["step"] == 5
    assert json.loads((tmp_path / "run" / "results.json").read_text())["steps"] == 5  # tested again
    assert run_train(tmp_path / "run", "eval.every_steps=0", "train.max_steps=5", "data.workers=1",
                     resume=True) == 0  # fmt: skip
    assert f"resuming with data.workers (-1 -> 1) ({checks})" in capsys.readouterr().out


@needs_data
def test_moving_average_is_saved_for_inference_and_resumes_exactly(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    ema = ("eval.every_steps=0", "train.ema_decay=0.9")
    assert run_train(straight, *ema) == 0
    assert run_train(resumed, *ema, "train.max_steps=6") == 0
    assert run_train(resumed, *ema, "train.max_steps=12", resume=True) == 0
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(resumed / "last.pt")
    for key in ("model", "train_model"):
        for name, tensor in a[key].items():
            assert torch.equal(tensor, b[key][name]), f"{key}.{name}"
    name = "encoder.layers.0.ffn.linear1.weight"
    assert not torch.equal(a["model"][name], a["train_model"][name])  # the average is not the last step
    # what a user translates with is the average
    from transformer.runtime.checkpoints import load_for_inference

    model, _, _ = load_for_inference(straight / "last.pt")
    assert torch.equal(model.state_dict()[name], a["model"][name])


@needs_data
@pytest.mark.parametrize(
    "override, message",
    [
        ("train.max_stepz=3", "unknown key train.max_stepz"),
        ("model.n_heads=3", "model.d_model=32 is not divisible by model.n_heads=3"),
        ("data.src_lang=xx", "'xx'"),
    ],
)
def test_config_errors_exit_nonzero_and_name_the_key(tmp_path, capsys, override, message):
    assert run_train(tmp_path / "run", override) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@needs_data
def test_resume_refuses_a_changed_data_or_model_config(tmp_path, capsys):
    assert run_train(tmp_path / "run", "eval.every_steps=0", "train.max_steps=2") == 0
    assert run_train(tmp_path / "run", "data.max_tokens=500", "model.d_ff=32", resume=True) == 1
    err = capsys.readouterr().err
    assert "other values of model.d_ff, data.max_tokens; cannot resume" in err


class FastGrowingScaler(torch.amp.GradScaler):
    """Doubles its loss scale every 2 good updates (PyTorch's default: 2000), so that within 12 steps the
    scale both grows and, on fp16 overflows, backs off and skips updates: its state shapes the run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, growth_interval=2, **kwargs)


@needs_data
def test_fp16_with_grad_scaler_resumes_exactly(tmp_path, monkeypatch):
    """The fp16 path (autocast + GradScaler, here on the CPU): 6 steps, stop, --resume to 12 == 12 steps
    straight, bit for bit, the scaler's loss scale and growth tracker included (saved and restored)."""
    monkeypatch.setattr(torch.amp, "GradScaler", FastGrowingScaler)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    fp16 = ("train.precision=fp16", "eval.every_steps=0")
    assert run_train(straight, *fp16, "train.checkpoint_every=3") == 0
    assert run_train(resumed, *fp16, "train.max_steps=6") == 0
    assert run_train(resumed, *fp16, "train.max_steps=12", resume=True) == 0
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(resumed / "last.pt")
    assert a["state"]["step"] == b["state"]["step"] == 12
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert a["scaler"] == b["scaler"]  # scale, _growth_tracker and the scaler's settings
    results = json.loads((resumed / "results.json").read_text())
    assert a["state"]["precision"] == results["precision"] == "fp16"
    # 12 good updates, doubling the initial 2**16 every 2, would reach 2**22: an overflow halved it (and
    # its update was skipped), so the scaler's state decided which updates happened
    assert a["scaler"]["growth_interval"] == 2 and 2**16 < a["scaler"]["scale"] < 2**22


@needs_data
def test_bf16_training_on_a_cpu_without_bf16_instructions_says_so(tmp_path, monkeypatch, capsys):
    cpu_with(monkeypatch)  # an AVX2 CPU
    one_step = ("train.precision=bf16", "train.max_steps=1", "eval.every_steps=0")
    assert run_train(tmp_path / "bf16", *one_step) == 0
    err = capsys.readouterr().err
    assert "warning: train.precision=bf16: this CPU has no bf16 matrix instructions" in err


@needs_data
@pytest.mark.parametrize(("features", "expected"), [(("avx512_bf16",), "bf16"), ((), "fp32")])
@pytest.mark.usefixtures("onednn_env")
def test_auto_precision_trains_and_validates_in_its_choice(tmp_path, monkeypatch, capsys, features, expected):
    """train.precision=auto on the CPU: bf16 where the CPU has bf16 instructions, else fp32; the run says
    which, results.json records it, and validation decodes in it."""
    cpu_with(monkeypatch, *features)
    decoded_in = []
    real_search = validation.search

    def recording_search(model, *args, **kwargs):
        decoded_in.append(model.output_proj.weight.dtype)  # bf16 on the CPU: a bf16 copy of the model
        return real_search(model, *args, **kwargs)

    monkeypatch.setattr(validation, "search", recording_search)
    one_step = ("train.precision=auto", "train.max_steps=2", "eval.every_steps=2")
    assert run_train(tmp_path / "auto", *one_step) == 0
    out, err = capsys.readouterr()
    assert f"parameters on cpu ({expected})" in out and "warning" not in err
    assert json.loads((tmp_path / "auto" / "results.json").read_text())["precision"] == expected
    assert decoded_in and set(decoded_in) == {torch.bfloat16 if expected == "bf16" else torch.float32}


@needs_data
@pytest.mark.usefixtures("onednn_env")
def test_resuming_in_another_precision_than_the_run_trained_in_is_refused(tmp_path, monkeypatch, capsys):
    """A run started with auto on a CPU with bf16 instructions, resumed on one without: auto would now mean
    fp32, and the resumed steps would silently follow another curve."""
    steps = ("train.precision=auto", "eval.every_steps=0")
    cpu_with(monkeypatch, "avx512_bf16")
    assert run_train(tmp_path / "run", *steps, "train.max_steps=2") == 0
    cpu_with(monkeypatch)
    capsys.readouterr()
    assert run_train(tmp_path / "run", *steps, "train.max_steps=4", resume=True) == 1
    refused = "was trained in bf16; train.precision=auto is fp32 here: resume with --set train.precision=bf16"
    assert refused in capsys.readouterr().err
    assert run_train(tmp_path / "run", "train.precision=bf16", "train.max_steps=4", resume=True) == 0


def test_resume_without_checkpoint_is_an_error(tmp_path, capsys):
    assert run_train(tmp_path / "nothing", resume=True) == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_learning_rate_schedule_of_section_5_3():
    d, warmup = 512, 4000
    peak = learning_rate(warmup, d, warmup, 1.0)
    assert peak == pytest.approx(d**-0.5 * warmup**-0.5)
    assert learning_rate(warmup // 2, d, warmup, 1.0) == pytest.approx(peak / 2)  # linear warmup
    assert learning_rate(4 * warmup, d, warmup, 1.0) == pytest.approx(peak / 2)  # 1/sqrt(step) decay


def test_adam_updates_by_the_formula_of_kingma_and_ba_with_the_papers_betas():
    """Two updates of train.py's optimizer (PyTorch's fused kernel on the CPU) against Adam by hand."""
    weight = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    optimizer = make_optimizer(torch.nn.ParameterList([weight]), TrainConfig())
    assert optimizer.param_groups[0]["fused"]
    b1, b2, eps, lr = 0.9, 0.98, 1e-9, 0.01
    expected, m, v = weight.detach().clone(), torch.zeros(3), torch.zeros(3)
    for t, grad in enumerate([torch.tensor([0.3, -0.2, 0.0]), torch.tensor([-0.1, -0.4, 0.5])], start=1):
        weight.grad = grad.clone()
        set_lr(optimizer, lr)
        optimizer.step()
        m, v = b1 * m + (1 - b1) * grad, b2 * v + (1 - b2) * grad**2
        expected -= lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    torch.testing.assert_close(weight.detach(), expected)


def test_an_optimizer_state_saved_by_a_non_fused_adam_resumes_on_the_fused_kernel_under_fp16_scaling():
    weight = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    weight.grad = torch.ones(3)
    older = torch.optim.Adam([weight], lr=0.01, betas=(0.9, 0.98), eps=1e-9)  # a checkpoint of older code
    older.step()
    optimizer = make_optimizer(torch.nn.ParameterList([weight]), TrainConfig())
    load_optimizer_state(optimizer, older.state_dict())
    assert optimizer.param_groups[0]["fused"] and optimizer.param_groups[0]["lr"] == 0.01
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)  # hands the fused kernel its found_inf
    optimizer.zero_grad()
    scaler.scale(weight.sum()).backward()
    before = weight.detach().clone()
    scaler.step(optimizer)
    assert not torch.equal(weight.detach(), before)  # stepped, from the loaded moments


def test_cooldown_factor_falls_linearly_to_zero_over_the_last_fraction_of_the_budget():
    assert [cooldown_factor(used, 0.25) for used in (0.0, 0.5, 0.75, 0.875, 1.0, 1.2)] == pytest.approx(
        [1.0, 1.0, 1.0, 0.5, 0.0, 0.0]
    )
    assert cooldown_factor(0.99, 0.0) == 1.0  # no cooldown: the paper's schedule to the end
    assert cooldown_factor(0.5, 1.0) == pytest.approx(0.5)  # over the whole run


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"cooldown": 1.5, "max_steps": 10}, "train.cooldown=1.5 must be in [0, 1]"),
        ({"cooldown": 0.2, "max_epochs": 9}, "train.cooldown=0.2 needs train.max_steps or train.max_minutes"),
    ],
)
def test_cooldown_needs_a_budget_in_steps_or_minutes(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**settings)


@needs_data
def test_cooldown_run_logs_the_annealed_rate_down_to_its_last_update(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert run_train(tmp_path / "run", "train.cooldown=0.5", "train.log_every=1") == 0
    lrs = [e.value for e in EventAccumulator(str(tmp_path / "run")).Reload().Scalars("train/lr")]
    config = load_config(TINY).train  # 12 steps, warmup 4: updates 8..12 in the cooldown (6 of 12 spent)
    scale = config.peak_lr / (32**-0.5 * config.warmup_steps**-0.5)
    spent = range(12)  # updates before update t = spent + 1
    expected = [learning_rate(k + 1, 32, config.warmup_steps, scale) * min(1.0, (12 - k) / 6) for k in spent]
    assert lrs == pytest.approx(expected, rel=1e-6)  # the §5.3 schedule until update 7, then annealed
    assert lrs[-1] == pytest.approx(learning_rate(12, 32, config.warmup_steps, scale) / 6)  # 1/6 left
    assert lrs[7] < learning_rate(8, 32, config.warmup_steps, scale)


def test_overfits_a_tiny_set_to_near_zero_loss():
    torch.manual_seed(0)
    config = ModelConfig(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0)
    model = Transformer(config, 20, 20, pad_id=0, bos_id=2, eos_id=3)
    pairs = [
        (torch.randint(4, 20, (n,)).tolist(), torch.randint(4, 20, (n + 1,)).tolist()) for n in range(3, 11)
    ]
    batch = collate(pairs, range(len(pairs)), pad_id=0, bos_id=2, eos_id=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    for _ in range(150):
        loss = token_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0, 0.0) / batch.n_tgt_tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.02


@needs_data
def test_torchrun_two_cpu_processes(tmp_path):
    """Data-parallel on 2 CPU processes with gloo, stopped by the wall-clock budget (whose clocks differ
    between the processes); only rank 0 writes the run folder."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(ROOT / "train.py"), "--config", TINY, "--run-dir", str(tmp_path / "ddp"),
        "--data-dir", str(DATA_DIR), "--set", "train.max_steps=0", "--set", "train.max_minutes=0.05",
        "--set", "eval.every_steps=3", "--set", "train.cooldown=0.5",  # a collective per vote: no hang
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert results["stopped_by"] == "max_minutes"  # both ranks stopped at the same step: no hang
    assert results["steps"] > 0
    assert result.stdout.count("test BLEU") == 1  # printed by rank 0 only
    ranks = load_checkpoint(tmp_path / "ddp" / "last.pt")["rng"]["ranks"]  # each rank's own, for --resume
    assert len(ranks) == 2 and not torch.equal(ranks[0]["torch"], ranks[1]["torch"])  # own dropout masks


@needs_data
def test_more_test_sets_are_decoded_and_reported_and_a_missing_one_stops_before_training(tmp_path, capsys):
    lines = {lang: read_lines(DATA_DIR / f"val.{lang}.gz")[:10] for lang in ("de", "en")}
    for lang, text in lines.items():
        (tmp_path / f"extra.{lang}").write_text("".join(line + "\n" for line in text), encoding="utf-8")
    assert run_train(tmp_path / "run", f"eval.test_sets={{extra: {tmp_path / 'extra'}}}") == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    extra = results["test_sets"]["extra"]
    assert extra["sentences"] == 10 and 0 <= extra["bleu"] <= 100 and "tok:13a" in extra["signature"]
    hypotheses = (tmp_path / "run" / "test_hypotheses.extra.txt").read_text(encoding="utf-8")
    assert hypotheses.count("\n") == 10
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert "test/extra/bleu" in EventAccumulator(str(tmp_path / "run")).Reload().Tags()["scalars"]
    capsys.readouterr()
    assert run_train(tmp_path / "run2", f"eval.test_sets={{gone: {tmp_path / 'gone'}}}") == 1
    assert "gone.de: file not found" in capsys.readouterr().err and not (tmp_path / "run2").exists()
    with pytest.raises(ConfigError, match="'a b' is not a usable name"):
        load_config(TINY, ["eval.test_sets={a b: x}"])
