"""bench/gpu.py, the prepared GPU run, in its CPU smoke mode: every stage runs and leaves its figures, in a
Python that cannot import ``datasets`` (as on the GPU image); a failing or slow stage is recorded and the next
one still runs. The stages' shares fit the budget, OUT/results.json survives a kill at any moment, and the
TensorBoard events that come back are bounded. And train.py itself trains where ``import datasets`` fails."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import gpu
import pytest
import torch
from helpers import DATA_DIR, ROOT, needs_data

SCRIPT = ROOT / "bench" / "gpu.py"


@pytest.fixture
def no_datasets_env(tmp_path) -> dict:
    """An environment whose Pythons fail on ``import datasets`` (a sitecustomize that blocks it)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nsys.modules['datasets'] = None  # as on the GPU image\n"
    )
    return os.environ | {"PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1"}


def run_script(out: Path, env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), str(out), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


@needs_data
def test_smoke_mode_runs_every_stage_without_datasets(tmp_path, no_datasets_env):
    out = tmp_path / "out"
    done = run_script(out, no_datasets_env, "--smoke", "--data-dir", str(DATA_DIR))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    stages = results["stages"]
    assert list(stages) == list(gpu.STAGES) and not [s for s in stages.values() if "error" in s]
    assert stages["env"]["datasets_version"] is None and stages["env"]["torch"]  # really without datasets
    for stage in ("throughput", "compile"):
        (run,) = stages[stage]["runs"]
        assert run["ours_tgt_tokens_per_s"] > 0 and run["torch_tgt_tokens_per_s"] > 0 and run["ours_mfu"] > 0
    assert stages["compile"]["compile"] == "eager" and stages["throughput"]["compile"] is None
    train = stages["train"]
    assert train["steps"] == 12 and "tok:13a" in train["signature"] and train["test_bleu"] is not None
    decode = stages["decode"]
    assert decode["sentences"] == 8 and decode["cache_differs"] == 0
    for method in ("greedy_cache", "greedy_no_cache", "beam4_cache"):
        assert decode[method]["sentences_per_s"] > 0 and decode[method]["bleu"] is not None
    summary = results["summary"]
    assert [k for k, v in summary.items() if v is None] == ["gpu"]  # every figure but the GPU's name
    events = [out / name for name in train["tensorboard"]]
    assert len(events) == 2 and all(e.is_file() for e in events)
    assert b"\x89PNG" not in b"".join(e.read_bytes() for e in events)  # no heatmaps: scalars and texts
    assert train["tensorboard_bytes"] == sum(e.stat().st_size for e in events) <= gpu.EVENTS_CAP_BYTES
    assert sum(results["shares_s"].values()) <= results["budget_s"] == 900
    assert all(s["seconds"] <= s["limit_s"] for s in stages.values())
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8  # what the device machine brings back: at most 8 files, no checkpoints
    assert not Path(results["work"]).exists()  # the scratch folder with the checkpoints is gone


def test_a_failing_stage_is_recorded_and_the_next_still_runs(tmp_path, no_datasets_env):
    out, empty = tmp_path / "out", tmp_path / "empty"
    empty.mkdir()
    done = run_script(
        out, no_datasets_env, "--smoke", "--data-dir", str(empty), "--stages", "env", "train", "decode"
    )
    assert done.returncode == 1
    stages = json.loads((out / "results.json").read_text())["stages"]
    assert "error" not in stages["env"] and stages["env"]["python"]
    assert "exited with 1" in stages["train"]["error"] and "file not found" in done.stderr
    assert "CheckpointError" in stages["decode"]["error"]  # no best.pt: recorded, not a crash
    assert "failed stages: train, decode" in done.stdout


def test_a_stage_past_its_time_is_killed_and_recorded(tmp_path):
    figures = gpu.run_stage("throughput", [str(tmp_path / "out"), "--smoke"], tmp_path, seconds=0.5)
    assert figures["error"].startswith("timed out after")
    assert figures["seconds"] < 30


@pytest.mark.parametrize(
    "budget, minutes", [(570, 5.0), (570, 2.0), (450, 5.0), (600, 5.0), (900, 5.0), (1200, 8.0)]
)
def test_the_stages_shares_fit_the_budget(budget, minutes):
    shares, fitted, note = gpu.plan_shares(list(gpu.STAGES), budget, minutes)
    assert list(shares) == list(gpu.STAGES) and sum(shares.values()) <= budget
    assert min(shares.values()) >= gpu.MIN_STAGE_S
    assert shares["train"] >= fitted * 60 + gpu.TRAIN_SETUP_S and gpu.MIN_TRAIN_MINUTES <= fitted <= minutes
    assert (note is None) == (fitted == minutes)  # a shorter training is said, never silent
    assert gpu.plan_shares(list(gpu.STAGES), 570, 5.0)[1:] == (5.0, None)  # the defaults fit as they are
    shares, *_ = gpu.plan_shares(["env", "decode"], budget, minutes)  # no train stage: the others share all
    assert sum(shares.values()) <= budget and shares["decode"] > gpu.SHARES["decode"]


@pytest.mark.parametrize("budget, stages", [(300, gpu.STAGES), (60, ("env", "throughput"))])
def test_a_budget_too_small_is_an_error_at_the_start(tmp_path, budget, stages):
    with pytest.raises(gpu.BudgetError, match="too small"):
        gpu.plan_shares(list(stages), budget, 5.0)
    out = tmp_path / "out"
    done = run_script(out, os.environ, "--budget-s", str(budget), "--stages", *stages, timeout=60)
    assert done.returncode == 2 and f"--budget-s {budget} is too small" in done.stderr
    assert not (out / "results.json").exists()  # no stage ran


@pytest.mark.parametrize("budget, minutes", [(None, 5.0), (450, 5.0), (900, 5.0), (1200, 8.0)])
def test_each_stage_gets_its_share_and_what_earlier_stages_left(tmp_path, monkeypatch, budget, minutes):
    """Fake stages on a fake clock: env ends early, train a little early, throughput, decode and compile run
    into their limits. Every stage still runs, for at least its share; what env and train left goes to the
    next stage; all of it fits the budget. When a stage starts, results.json holds every earlier stage."""
    clock, out, calls = SimpleNamespace(now=0.0), tmp_path / "out", []
    spends = {"env": 5.0}  # train: its minutes and 60 s (of its 75 s of setup); the others: all they may

    def fake_run_stage(name: str, argv: list[str], work: Path, seconds: float) -> dict:
        written = out / "results.json"
        calls.append((name, seconds, json.loads(written.read_text()) if written.is_file() else {}, argv))
        spends["train"] = float(argv[-1]) * 60 + 60  # argv ends with --train-minutes, what fits
        spent = min(spends.get(name, float("inf")), seconds)
        clock.now += spent
        return {"seconds": spent} | ({"error": "timed out"} if spent == seconds else {})

    monkeypatch.setattr(gpu, "run_stage", fake_run_stage)
    monkeypatch.setattr(gpu, "time", SimpleNamespace(monotonic=lambda: clock.now, ctime=time.ctime))
    budget_args = ["--budget-s", str(budget)] if budget else []
    assert gpu.main([str(out), "--train-minutes", str(minutes), *budget_args]) == 1  # timed out: failed
    budget = budget or 570
    assert [name for name, *_ in calls] == list(gpu.STAGES) and clock.now <= budget
    results = json.loads((out / "results.json").read_text())
    shares, limits = results["shares_s"], {name: seconds for name, seconds, *_ in calls}
    assert sum(shares.values()) <= budget and all(limits[s] >= shares[s] for s in gpu.STAGES)
    assert limits["throughput"] == pytest.approx(shares["throughput"] + limits["env"] - 5.0)
    assert limits["decode"] == pytest.approx(shares["decode"] + limits["train"] - spends["train"])
    assert limits["compile"] == pytest.approx(shares["compile"])
    for i, (name, seconds, written, argv) in enumerate(calls):
        assert list(written["stages"]) == list(gpu.STAGES[: i + 1])  # the earlier stages, and this one:
        assert written["stages"][name] == {"error": gpu.UNFINISHED, "limit_s": round(seconds, 1)}
        assert argv[-2:] == ["--train-minutes", f"{results['train_minutes']:g}"]  # what fits, to the stage
    assert (results["train_minutes"] < minutes) == (budget == 450) == (results["note"] is not None)
    assert results["stages"]["env"] == {"seconds": 5.0, "limit_s": round(limits["env"], 1)}


def stage_processes(out: Path) -> list[str]:
    """The command lines of the stage processes of the run writing to ``out`` (Linux: /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found += [line] if str(out) in line and "--stage " in line else []
    return found


def wait_for(condition, seconds: float):
    end = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < end:
        time.sleep(0.05)
    return value


@needs_data
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_kill_during_a_stage_leaves_the_stages_done_so_far(tmp_path, no_datasets_env, sig):
    """As the 10-minute limit of the GPU machine would: results.json keeps env's figures and says that train
    did not finish (SIGKILL: the record written before the stage; SIGTERM: the run's own), and the stage's
    process (in a process group of its own) does not outlive the run."""
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), str(out), "--smoke", "--data-dir", str(DATA_DIR)]
    run = subprocess.Popen(
        command + ["--stages", "env", "train"], cwd=ROOT, env=no_datasets_env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    results = out / "results.json"

    def train_started() -> bool:
        return results.is_file() and "train" in json.loads(results.read_text())["stages"]

    try:
        assert wait_for(train_started, 300)
        assert wait_for(lambda: stage_processes(out), 30)  # the train stage's process has started
        assert json.loads(results.read_text())["stages"]["train"]["error"] == gpu.UNFINISHED
        os.kill(run.pid, sig)
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    stages = json.loads(results.read_text())["stages"]
    assert "error" not in stages["env"] and stages["env"]["python"]
    if sig == signal.SIGTERM:
        assert run.returncode == 128 + signal.SIGTERM and stages["train"]["error"] == "interrupted by SIGTERM"
        assert "tensorboard" in stages["train"]  # the events so far were copied
    else:
        assert run.returncode == -signal.SIGKILL and stages["train"]["error"] == gpu.UNFINISHED
    assert wait_for(lambda: not stage_processes(out), 15)
    assert not list(out.glob("*.tmp"))  # results.json is written whole or not at all


def test_the_tensorboard_events_that_come_back_are_capped(tmp_path):
    """copy_events keeps at most the cap: the smallest file whole, the large one cut after a whole record
    (TensorBoard reads it to its end: every scalar, fewer images), and says which file it cut."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    run_dir, out, cap = tmp_path / "run", tmp_path / "out", 100_000
    writer = SummaryWriter(str(run_dir))
    for step in range(100):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    for step in range(10):
        writer.add_image("val/heatmap", torch.rand(3, 128, 128), step)  # a PNG of noise: ~50 KB each
    writer.add_hparams({"lr": 1.0}, {"hparam/test_bleu": 1.0}, run_name="hparams")
    writer.close()
    figures = gpu.copy_events(run_dir, out, cap=cap)
    copied = [out / name for name in figures["tensorboard"]]
    assert len(copied) == 2 and figures["tensorboard_bytes"] == sum(f.stat().st_size for f in copied) <= cap
    (cut,) = figures["tensorboard_cut"]
    assert cut.startswith("tensorboard/events.out.tfevents.") and f"the cap is {cap} bytes" in cut
    assert all(gpu.whole_records(f, cap) == f.stat().st_size for f in copied)
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    assert len(events.Scalars("train/loss")) == 100 and 0 < len(events.Images("val/heatmap")) < 10
    assert "tensorboard_cut" not in gpu.copy_events(run_dir, tmp_path / "all", cap=10**9)


def test_the_train_stage_draws_no_heatmaps(tmp_path):
    """Attention heatmaps are most of a run's events and take time to draw: the GPU run's train stage (and
    its smoke run) logs none, only scalars and texts."""
    from transformer.runtime.configs import load_config

    for smoke in ([], ["--smoke"]):
        plan = gpu.make_plan(gpu.parse_args([str(tmp_path), *smoke]))
        config = load_config(gpu.GPU_CONFIG, plan.train_overrides)
        assert config.eval.n_alignment_sentences == 0 and config.train.max_minutes == 5.0


@needs_data
def test_train_py_trains_where_datasets_cannot_be_imported(tmp_path, no_datasets_env):
    """The corpus is plain lists of lines; only data.dataset: hub imports ``datasets``."""
    code = (
        "import sys\n"
        "try:\n    import datasets\nexcept ImportError:\n    pass\nelse:\n    sys.exit('datasets imported')\n"
        "from transformer.commands import train\n"
        f"sys.exit(train.main(['--config', 'tiny', '--run-dir', {str(tmp_path / 'run')!r},\n"
        f"    '--data-dir', {str(DATA_DIR)!r}, '--set=train.max_steps=3', '--set=eval.every_steps=0',\n"
        "    '--set=data.eval_limit=4', '--set=eval.n_alignment_sentences=0']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=no_datasets_env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["steps"] == 3
