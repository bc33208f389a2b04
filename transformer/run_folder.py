"""A training run's folder: config.yaml (resolved), tokenizer.model, last.pt / best.pt, the TensorBoard
events, test_hypotheses.txt and results.json. Rank 0 writes; the other ranks only read the tokenizer.
"""

import json
from pathlib import Path

import torch.distributed as dist
import yaml

from transformer.config import Config
from transformer.corpus import ParallelText
from transformer.runtime import Runtime
from transformer.tokenizer import Tokenizer, train_tokenizer


class RunFolderError(RuntimeError):
    """The run folder cannot be used; the message says which and why."""


def prepare_run_dir(config: Config, run_dir: Path, runtime: Runtime) -> None:
    """Create the folder and write the resolved config.yaml (rank 0)."""
    if runtime.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        except OSError as error:
            raise RunFolderError(f"cannot write to run folder {run_dir}: {error.strerror}") from None


def run_tokenizer(run_dir: Path, train: ParallelText, config: Config, runtime: Runtime) -> Tokenizer:
    """The run's joint SentencePiece model (§5.1: a shared vocabulary), learnt by rank 0 from both sides
    of the training split on the first start, read back on resume and by every rank."""
    path, data = run_dir / "tokenizer.model", config.data
    if runtime.is_main and not path.exists():
        train_tokenizer(train.src + train.tgt, run_dir / "tokenizer", data.vocab_size, data.tokenizer_type)
    if runtime.world_size > 1:
        dist.barrier()
    return Tokenizer(path)


def write_results(run_dir: Path, results: dict, hypotheses: list[str]) -> None:
    """results.json and the test translations, one per line."""
    (run_dir / "test_hypotheses.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
