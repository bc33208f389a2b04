"""The fixtures every test folder shares: deterministic seeds, a token cache of the test run's own,
Multi30k and a tokenizer trained on it, synthetic sentence lengths, and a tiny checkpoint trained once per
test run. The plain helpers (paths, random models, in-process commands) are in helpers.py."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import CONFIGS, DATA_DIR, run_command

from transformer.commands import train
from transformer.training import multi30k
from transformer.training.corpus import Corpus
from transformer.training.multi30k import load_multi30k
from transformer.training.tokenizer_job import train_tokenizer

# The token cache of the whole session (and of the train.py runs it starts) in one temporary folder, so that
# the tests neither read nor fill the user's own cache; $TRANSFORMER_MT_CACHE given to pytest is kept.
if not os.environ.get("TRANSFORMER_MT_CACHE"):
    os.environ["TRANSFORMER_MT_CACHE"] = tempfile.mkdtemp(prefix="transformer-mt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TRANSFORMER_MT_CACHE"], ignore_errors=True)


# pytest -n N (pytest-xdist, `make test`): N worker processes share the cores, so each computes on one thread,
# and so do the commands its tests start (train.py, torchrun, the service): no core is asked for two threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def onednn_env(monkeypatch):
    """No ONEDNN_PRIMITIVE_CACHE_CAPACITY in the environment, and whatever the test sets (bf16 sets it:
    runtime.size_onednn_cache) undone after it."""
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")  # recorded, so undone after the test
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    missing = [name for name in multi30k.file_names() if not (DATA_DIR / name).is_file()]
    if missing:
        pytest.fail(f"no Multi30k in {DATA_DIR} ({len(missing)} files missing): run `make data` first, or "
                    "set MULTI30K_DIR (data/README.md)", pytrace=False)  # fmt: skip
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, multi30k_dir) -> Path:
    """best.pt of a tiny model trained once per session by train.py, in this process.

    the tiny config with 300 steps on 3000 pairs, so that it translates into more than one repeated token.
    """
    run_dir = tmp_path_factory.mktemp("tiny_run")
    argv = [
        "--config", str(CONFIGS / "tiny.yaml"), "--run-dir", str(run_dir), "--data-dir", str(multi30k_dir),
        "--set", "train.max_steps=300", "--set", "data.train_limit=3000", "--set", "eval.every_steps=0",
    ]  # fmt: skip
    done = run_command(train.main, argv)
    assert done.returncode == 0, f"tiny training failed:\n{done.stderr[-3000:]}"
    return run_dir / "best.pt"


@pytest.fixture(scope="session")
def de_en(multi30k_dir) -> Corpus:
    return load_multi30k("de", "en", data_dir=multi30k_dir)


@pytest.fixture(scope="session")
def tokenizer(de_en, tmp_path_factory):
    train = de_en["train"].head(3000)
    sentences = [sentence for pair in zip(train.src, train.tgt) for sentence in pair]
    return train_tokenizer(sentences, tmp_path_factory.mktemp("spm") / "de_en", vocab_size=1000)


@pytest.fixture(scope="session")
def lengths() -> tuple[list[int], list[int]]:
    """3000 synthetic (source, target) lengths in tokens, plus two pairs too long for any budget."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(1, 60, (3000,), generator=generator)
    tgt = (src + torch.randint(-5, 6, (3000,), generator=generator)).clamp(min=1)
    return src.tolist() + [500, 3], tgt.tolist() + [4, 700]
