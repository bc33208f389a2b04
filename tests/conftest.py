"""Shared test helpers: deterministic seeds, the PyTorch reference modules with our weights copied in,
and a tiny checkpoint trained once per session."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from transformer.training import multi30k

# The token cache of the whole session (and of the train.py runs it starts) in one temporary folder, so that
# the tests neither read nor fill the user's own cache; $TRANSFORMER_MT_CACHE given to pytest is kept.
if not os.environ.get("TRANSFORMER_MT_CACHE"):
    os.environ["TRANSFORMER_MT_CACHE"] = tempfile.mkdtemp(prefix="transformer-mt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TRANSFORMER_MT_CACHE"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


ROOT = Path(__file__).resolve().parent.parent


# Multi30k, found by the project's one rule ($MULTI30K_DIR, else data/multi30k: data/README.md). `make test`
# fetches it first (`make data`); a test never skips for missing data, it fails and says how to get it.
DATA_DIR, _ = multi30k.locate()


@pytest.fixture
def onednn_env(monkeypatch):
    """No ONEDNN_PRIMITIVE_CACHE_CAPACITY in the environment, and whatever the test sets (bf16 sets it:
    runtime.size_onednn_cache) undone after it."""
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")  # recorded, so undone after the test
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")


needs_data = pytest.mark.usefixtures("multi30k_dir")  # a test that reads DATA_DIR: fails without it


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    missing = [name for name in multi30k.file_names() if not (DATA_DIR / name).is_file()]
    if missing:
        pytest.fail(f"no Multi30k in {DATA_DIR} ({len(missing)} files missing): run `make data` first, or "
                    "set MULTI30K_DIR (data/README.md)", pytrace=False)  # fmt: skip
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, multi30k_dir) -> Path:
    """best.pt of a tiny model trained once per session by train.py (~12 s on one CPU core).

    configs/tiny.yaml with 300 steps on 3000 pairs, so that it translates into more than one repeated token.
    """
    run_dir = tmp_path_factory.mktemp("tiny_run")
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"),
        "--run-dir", str(run_dir), "--data-dir", str(multi30k_dir), "--set", "train.max_steps=300",
        "--set", "data.train_limit=3000", "--set", "eval.every_steps=0",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, f"tiny training failed:\n{done.stderr[-3000:]}"
    return run_dir / "best.pt"


def as_pre_norm(checkpoint: Path, path: Path) -> Path:
    """The checkpoint made pre-norm (``model.norm_first: true``) with seeded final LayerNorms off 1 / 0:
    the same trained layers, another function, for the exports of pre-norm models."""
    state = torch.load(checkpoint, weights_only=True)
    state["config"]["model"]["norm_first"] = True
    D = state["model"]["encoder.layers.0.ffn_norm.weight"].numel()
    g = torch.Generator().manual_seed(3)
    for stack in ("encoder", "decoder"):
        state["model"][f"{stack}.final_norm.weight"] = 1.0 + 0.2 * torch.randn(D, generator=g)  # (D,)
        state["model"][f"{stack}.final_norm.bias"] = 0.2 * torch.randn(D, generator=g)  # (D,)
    torch.save(state, path)
    return path
