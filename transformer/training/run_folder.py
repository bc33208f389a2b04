"""A training run's folder: config.yaml (resolved), tokenizer.model (tokenizer.marian.zip when fine-tuned
from a released Marian model), last.pt / best.pt, the TensorBoard
events, test_hypotheses.txt and results.json. Rank 0 writes; the other ranks only read the tokenizer.
"""

import json
import os
import shutil
import zipfile
from contextlib import contextmanager
from pathlib import Path

import yaml

from transformer.core.checkpoint import save_checkpoint
from transformer.core.tokenizer import Tokenizer
from transformer.interop.formats import read_tokenizer as tokenizer_from_bytes
from transformer.runtime.configs import Config
from transformer.training.averaging import step_checkpoints
from transformer.training.cache import cached_tokenizer
from transformer.training.ranks import Runtime


class RunFolderError(RuntimeError):
    """The run folder cannot be used; the message says which and why."""


RUN_FILES = ("config.yaml", "tokenizer.model", "tokenizer.marian.zip", "last.pt", "best.pt", "results.json")
# what a run writes, all of which --overwrite removes (nothing else in the folder is touched); and
# tokenizer.vocab, which no run writes now (the cache keeps tokenizer.model alone) but older versions' did
WRITTEN = RUN_FILES + (
    "tokenizer.vocab",
    "test_hypotheses.txt",
    "test_hypotheses.*.txt",
    "averaged.pt",
    "events.*",
    "step_*.pt",
    "hparams",
)


SET_ASIDE = ".overwritten"  # where --overwrite keeps the old run until the new one has passed every check


def link_checkpoint(source: str | Path, path: str | Path) -> None:
    """Make ``path`` the same file as the checkpoint ``source`` without writing it again: a hard link under
    a temporary name, then a rename, so ``path`` is never partly written (a copy where links are refused).
    ``save_checkpoint`` replaces a file by renaming a new one over it: a link stays the old checkpoint."""
    source, path = Path(source), Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.link"
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(source, tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(source, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def written(run_dir: Path) -> set[Path]:
    """The files and folders of ``WRITTEN`` that ``run_dir`` holds."""
    return {p for pattern in WRITTEN for p in run_dir.glob(pattern)}


@contextmanager
def undone_if_refused(run_dir: Path, runtime: Runtime):
    """A run refused (or stopped) while it is set up leaves its folder as it was: what it wrote there goes,
    the old run that ``--overwrite`` set aside (``prepare_run_dir``) comes back, and a folder it created is
    removed if empty. Once set up, the old run is deleted."""
    existed = run_dir.is_dir()
    before = written(run_dir) if existed else set()
    try:
        yield
    except BaseException:
        if runtime.is_main:
            aside = run_dir / SET_ASIDE
            for path in written(run_dir):
                if path not in before or (aside / path.name).exists():
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            if aside.is_dir():
                for path in aside.iterdir():
                    path.rename(run_dir / path.name)
                aside.rmdir()
            if not existed and run_dir.is_dir() and not any(run_dir.iterdir()):
                run_dir.rmdir()
        raise
    if runtime.is_main:
        shutil.rmtree(run_dir / SET_ASIDE, ignore_errors=True)


def prepare_run_dir(config: Config, run_dir: Path, runtime: Runtime, resume: bool, overwrite: bool) -> None:
    """Create the folder and write the resolved config.yaml (rank 0).

    A fresh run (no ``resume``) refuses a folder that already holds a run: it would reuse its tokenizer and
    append to its TensorBoard events. ``overwrite`` sets the old run aside first (in ``SET_ASIDE``, deleted
    by ``undone_if_refused`` once the new run is set up)."""
    held = [name for name in RUN_FILES if (run_dir / name).exists()] + [
        p.name for p in run_dir.glob("events.*")
    ]
    runtime.wait_for_main()  # every rank has looked before rank 0 writes
    if held and not resume and not overwrite:
        raise RunFolderError(
            f"{run_dir} already holds a run ({', '.join(held[:3])}); use --resume to continue it, "
            "--overwrite to start it again, or another --run-dir"
        )
    if runtime.is_main:
        try:
            if overwrite and held and not resume:
                aside = run_dir / SET_ASIDE
                shutil.rmtree(aside, ignore_errors=True)
                aside.mkdir()
                for path in written(run_dir):
                    path.rename(aside / path.name)
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        except OSError as error:
            raise RunFolderError(f"cannot write to run folder {run_dir}: {error.strerror}") from None


def keep_step_checkpoint(run_dir: Path, checkpoint: dict, step: int, keep_last: int) -> None:
    """RUN_DIR/step_<step>.pt (weights, config, tokenizer: what averaging needs), keeping the last
    ``keep_last`` of them. With a moving average, ``model`` is it and ``train_model`` the raw weights."""
    slim = {
        k: checkpoint[k] for k in ("config", "model", "train_model", "tokenizer", "state") if k in checkpoint
    }
    save_checkpoint(slim, run_dir / f"step_{step}.pt")
    for old in step_checkpoints(run_dir)[:-keep_last]:
        old.unlink()


def run_tokenizer(
    run_dir: Path, loaded: list, symbols: list[str], config: Config, runtime: Runtime,
    source=None,
) -> Tokenizer:  # fmt: skip
    """The run's joint SentencePiece model (§5.1: a shared vocabulary): ``data.tokenizer``, or the one the
    cache holds for these training files and settings (learnt there from both sides of the training split
    the first time; ``data_cache.py``), or a fine-tuning ``source``'s (``init_from.py``), copied into the run
    folder by rank 0 on the first start; read back on resume and by every rank. A released Marian source
    brings its own tokenizer files, kept in ``tokenizer.marian.zip`` (``marian_text.py``)."""
    marian, spm = run_dir / "tokenizer.marian.zip", run_dir / "tokenizer.model"
    if runtime.is_main and not marian.exists() and not spm.exists():  # a new run (--resume: already there)
        if source is not None and not isinstance(source.tokenizer, Tokenizer):  # a released Marian model's
            marian.write_bytes(source.tokenizer.to_bytes())
        elif source is not None:  # fine-tuning a checkpoint of this project: its tokenizer
            spm.write_bytes(source.tokenizer.to_bytes())
        else:
            model = cached_tokenizer(loaded, symbols, config.data)
            shutil.copyfile(model, spm)
    runtime.wait_for_main()  # learning it may take longer than NCCL's timeout; every rank then reads it
    path = marian if marian.exists() else spm
    try:
        return tokenizer_from_bytes(path.read_bytes())
    except (ValueError, RuntimeError, OSError, zipfile.BadZipFile) as error:
        raise RunFolderError(f"{path} cannot be read as a tokenizer: {error}") from None


def write_results(run_dir: Path, results: dict, hypotheses: list[str]) -> None:
    """results.json and the test translations, one per line."""
    (run_dir / "test_hypotheses.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
