"""The package outside the checkout: the wheel built from this tree, installed into a fresh virtual
environment, trains and translates from an empty folder elsewhere (``transformer-mt train --config tiny``
finds the shipped config by name; ``python -m transformer`` does the same), and writes nothing into its own
site-packages folder, nor into the current folder beyond the run folder it is given."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import ROOT


def run(command: list, **options) -> subprocess.CompletedProcess:
    command = [str(part) for part in command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, **options)
    assert done.returncode == 0, f"{command} failed:\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh environment's bin folder, its site-packages): the wheel installed there alone; the
    dependencies (torch, sentencepiece, ...) are this environment's, seen through a .pth file, so that
    nothing is downloaded."""
    tmp = tmp_path_factory.mktemp("package")
    source = tmp / "source"  # what the wheel is built from: the tree's package, without caches
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    caches = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "transformer", source / "transformer", ignore=caches)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", tmp / "dist", source])
    (wheel,) = (tmp / "dist").glob("transformer_mt-*.whl")
    run([sys.executable, "-m", "venv", "--without-pip", tmp / "env"])
    python = tmp / "env" / "bin" / "python"
    run([*pip, "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel])
    where = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    site = Path(where.stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return python.parent, site


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_the_installed_package_is_the_wheel_not_the_checkout(environment):
    bin_folder, site = environment
    where = run([bin_folder / "python", "-c", "import transformer; print(transformer.__file__)"], cwd="/")
    assert Path(where.stdout.strip()).parent == site / "transformer"
    assert (site / "transformer" / "configs" / "tiny.yaml").is_file()  # the configs are package data
    listed = run([bin_folder / "transformer-mt", "--help"]).stdout
    assert all(f"  {command} " in listed for command in ("train", "translate", "serve"))
    serve = run([bin_folder / "transformer-mt", "serve", "--help"]).stdout  # the serve extra's command
    assert serve.startswith("usage: transformer-mt serve") and "--checkpoint" in serve


def test_train_and_translate_from_an_empty_folder_outside_the_checkout(environment, tmp_path, multi30k_dir):
    bin_folder, site = environment
    work = tmp_path / "work"
    work.mkdir()
    variables = {**os.environ, "MULTI30K_DIR": str(multi30k_dir), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    before = files_under(site)
    trained = run(
        [bin_folder / "transformer-mt", "train", "--config", "tiny", "--run-dir", "r",
         "--set", "train.max_steps=4", "--set", "eval.every_steps=0"],
        cwd=work, env=variables,
    )  # fmt: skip
    assert (work / "r" / "results.json").is_file(), trained.stderr
    assert any((tmp_path / "cache").iterdir())  # the token cache is the user's, as XDG_CACHE_HOME says
    translated = run([bin_folder / "transformer-mt", "translate", "--checkpoint", "r", "Ein Hund."], cwd=work)
    assert len(translated.stdout.splitlines()) == 1 and translated.stdout.strip()
    module = [bin_folder / "python", "-m", "transformer"]
    as_module = run([*module, "translate", "--checkpoint", "r", "Ein Hund."], cwd=work)
    assert as_module.stdout == translated.stdout
    command = [bin_folder / "transformer-mt", "translate", "--beam", "0", "--checkpoint", "r"]
    refused = subprocess.run(command, cwd=work, capture_output=True, text=True)
    said = "error: --beam must be >= 1, got 0 (see transformer-mt translate --help)\n"
    assert (refused.returncode, refused.stderr) == (2, said)
    assert sorted(p.name for p in work.iterdir()) == ["r"]
    assert files_under(site) == before
