"""Shared test helpers: deterministic seeds, the PyTorch reference modules with our weights copied in,
and a tiny checkpoint trained once per session."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


ROOT = Path(__file__).resolve().parent.parent


# The local Multi30k mirror: $MULTI30K_DIR, else ../shared/data/multi30k beside the checkout.
DATA_DIR = Path(os.environ.get("MULTI30K_DIR") or ROOT.parent / "shared" / "data" / "multi30k")
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"no Multi30k mirror at {DATA_DIR}")


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"no Multi30k mirror at {DATA_DIR}: set MULTI30K_DIR")
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """best.pt of a tiny model trained once per session by train.py (~12 s on one CPU core).

    configs/tiny.yaml with 300 steps on 3000 pairs, so that it translates into more than one repeated token.
    """
    data_dir = DATA_DIR
    if not (data_dir / "test_2016_flickr.de.gz").is_file():
        pytest.skip(f"no Multi30k mirror at {data_dir} (set MULTI30K_DIR)")
    run_dir = tmp_path_factory.mktemp("tiny_run")
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.yaml"),
        "--run-dir", str(run_dir), "--data-dir", str(data_dir), "--set", "train.max_steps=300",
        "--set", "data.train_limit=3000", "--set", "eval.every_steps=0",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, f"tiny training failed:\n{done.stderr[-3000:]}"
    return run_dir / "best.pt"
