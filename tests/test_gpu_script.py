"""bench/gpu.py, the prepared GPU run, in its CPU smoke mode: every stage runs and leaves its figures, in a
Python that cannot import ``datasets`` (as on the GPU image); a failing or slow stage is recorded and the next
one still runs. And train.py itself trains where ``import datasets`` fails."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA_DIR, needs_data

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu.py"
sys.path.insert(0, str(ROOT / "bench"))
import gpu  # noqa: E402


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
    assert stages["compile"]["compile"] == "aot_eager" and stages["throughput"]["compile"] is None
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


def test_a_stage_without_time_left_is_skipped(tmp_path, no_datasets_env):
    out = tmp_path / "out"
    done = run_script(out, no_datasets_env, "--smoke", "--budget-s", "1", "--stages", "env", "train")
    assert done.returncode == 1
    stages = json.loads((out / "results.json").read_text())["stages"]
    assert all(s["error"].startswith("skipped:") for s in stages.values())


@needs_data
def test_train_py_trains_where_datasets_cannot_be_imported(tmp_path, no_datasets_env):
    """The corpus is plain lists of lines; only data.dataset: hub imports ``datasets``."""
    code = (
        "import sys\n"
        "try:\n    import datasets\nexcept ImportError:\n    pass\nelse:\n    sys.exit('datasets imported')\n"
        "import train\n"
        f"sys.exit(train.main(['--config', 'configs/tiny.yaml', '--run-dir', {str(tmp_path / 'run')!r},\n"
        f"    '--data-dir', {str(DATA_DIR)!r}, '--set=train.max_steps=3', '--set=eval.every_steps=0',\n"
        "    '--set=data.eval_limit=4']))\n"
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
