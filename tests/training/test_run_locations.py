"""Where a run reads and writes: a config by name from any folder, the token cache in the user's cache
folder (or where $TRANSFORMER_MT_CACHE or data.cache_dir say), and nothing written into the checkout."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CONFIGS, ROOT, needs_data

from transformer.core.config import ConfigError
from transformer.runtime.configs import DataConfig, find_config, load_config
from transformer.training.cache import cache_root

IGNORED = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}


def checkout_files() -> dict[str, int]:
    """Every file of the checkout (not git's, the environment's or Python's own caches) and its mtime."""
    found = {}
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [n for n in subfolders if n not in IGNORED and not n.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            found[str(path.relative_to(ROOT))] = path.stat().st_mtime_ns
    return found


def test_a_config_is_found_by_name_or_by_path_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_config("tiny") == CONFIGS / "tiny.yaml"
    assert find_config("tiny.yaml") == CONFIGS / "tiny.yaml"
    (tmp_path / "mine.yaml").write_text("model:\n  d_model: 64\n  n_heads: 2\n", encoding="utf-8")
    assert load_config("mine.yaml").model.d_model == 64  # a path from the current folder
    assert load_config(tmp_path / "mine.yaml").model.d_model == 64
    (tmp_path / "tiny.yaml").write_text("model:\n  d_model: 48\n  n_heads: 2\n", encoding="utf-8")
    assert load_config("tiny.yaml").model.d_model == 48  # a file that exists wins over the project's
    with pytest.raises(ConfigError, match=r"config tinny: no such file, nor .*\(base, .*tiny"):
        load_config("tinny")
    with pytest.raises(ConfigError, match="cannot read config elsewhere/tiny: no such file"):
        load_config("elsewhere/tiny")  # a path names a file, never a shipped config


def test_the_cache_is_the_users_unless_moved(tmp_path, monkeypatch):
    monkeypatch.delenv("TRANSFORMER_MT_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root(DataConfig()) == tmp_path / "home" / ".cache" / "transformer-mt"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root(DataConfig()) == tmp_path / "xdg" / "transformer-mt"
    monkeypatch.setenv("TRANSFORMER_MT_CACHE", str(tmp_path / "env"))
    assert cache_root(DataConfig()) == tmp_path / "env"
    assert cache_root(DataConfig(cache_dir=str(tmp_path / "key"))) == tmp_path / "key"


@needs_data
def test_a_run_outside_the_checkout_writes_nothing_into_it(tmp_path, multi30k_dir):
    """train.py started from another folder with --config tiny, its run folder and data outside the
    checkout: the cache goes to $XDG_CACHE_HOME/transformer-mt, and no checkout file appears or changes."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRANSFORMER_MT_CACHE", "MULTI30K_DIR")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONDONTWRITEBYTECODE="1")
    before = checkout_files()
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        "tiny",
        "--run-dir",
        "run",
        "--data-dir",
        str(multi30k_dir),
        "--set",
        "train.max_steps=2",
        "--set",
        "eval.every_steps=0",
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "results.json").is_file()
    entries = [p.name.split("-")[0] for p in (tmp_path / "xdg" / "transformer-mt").iterdir()]
    assert sorted(name for name in entries if not name.startswith(".")) == ["store", "tokenizer"]  # not locks
    after = checkout_files()
    changed = sorted(set(before.items()) ^ set(after.items()))
    assert not changed, f"the run wrote into the checkout: {changed}"


@pytest.mark.parametrize("variable", [None, "XDG_CACHE_HOME", "TRANSFORMER_MT_CACHE"])
def test_make_clean_removes_the_cache_the_code_uses(tmp_path, monkeypatch, variable):
    for name in ("TRANSFORMER_MT_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if variable:
        monkeypatch.setenv(variable, str(tmp_path / "moved"))
    done = subprocess.run(["make", "-n", "clean"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert f'"{cache_root(DataConfig())}"' in done.stdout.split(), done.stdout
