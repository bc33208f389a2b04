"""A training run's objects and their checkpoints: ``setup`` builds everything ``train.py``'s loop needs
(corpus, tokenizer, model, optimizer, run folder, TensorBoard writer) into one ``Run``; ``save`` writes it.

``State`` is where training stands; it goes into every checkpoint so that ``--resume`` continues exactly.
"""

import sys
import time
from dataclasses import dataclass, field
from inspect import signature
from pathlib import Path

import torch

from transformer.core.checkpoint import load_checkpoint, save_checkpoint
from transformer.core.optim import make_optimizer
from transformer.core.tokenizer import Tokenizer
from transformer.fast.twins import speed_up
from transformer.interop.formats import build_model
from transformer.runtime.configs import Config
from transformer.runtime.corpora import parts_of, prefix_ids, user_symbols
from transformer.runtime.lines import DataError
from transformer.runtime.precision import slow_precision
from transformer.training import reporting
from transformer.training.cache import train_store
from transformer.training.datasets import load_parts
from transformer.training.ema import EMA
from transformer.training.fine_tuning import check_source, load_source, start_from, with_source_model
from transformer.training.ranks import Runtime, setup_runtime
from transformer.training.resume import (
    RESUME_CHECKS,
    changed_settings,
    check_resumable,
    restore_training,
    rng_state,
    training_checkpoint,
)
from transformer.training.run_folder import link_checkpoint, prepare_run_dir, run_tokenizer, undone_if_refused
from transformer.training.splits import Splits, cleaning_line, encode_corpus, mixture_line


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, unwritable run folder, ...); the message says why."""


@dataclass
class State:
    """Where training stands; saved in every checkpoint so that --resume continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    best_score: float | None = None  # of eval.select_by, signed so that higher is better
    best_bleu: float = -1.0  # validation BLEU of best.pt
    best_step: int = 0
    bad_evals: int = 0  # evaluations since best.pt (train.patience)
    train_tokens: int = 0
    train_seconds: float = 0.0
    history: list = field(default_factory=list)
    world_size: int = 1  # processes that share the epochs (batch_in_epoch counts one rank's shard)
    # stopped inside an update (train.accum_steps > 1): [epoch, batch_in_epoch] of its first micro-batch,
    # where --resume reads again if training goes on
    pending_from: list | None = None
    precision: str | None = None  # what training ran in ("fp32", "bf16", "fp16"; older checkpoints: None)


@dataclass
class Run:
    """What one training run holds: its settings, data, model and optimizer, its writer, and ``state``."""

    config: Config
    run_dir: Path
    runtime: Runtime
    tokenizer: Tokenizer
    splits: Splits
    model: torch.nn.Module  # wrapped in DistributedDataParallel under torchrun
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # fp16 loss scaling; a no-op otherwise
    ema: EMA | None
    state: State
    writer: object = None  # a SummaryWriter on rank 0
    started: float = 0.0  # time.perf_counter() at which training (as resumed) began
    clock_used: float = 0.0  # the fraction of train.max_minutes spent, as the ranks last agreed (cooldown)
    never_produced: list[int] = field(default_factory=list)  # model.never_produced: no smoothing mass
    nonfinite: torch.Tensor | None = None  # a non-finite loss or gradient since the last check (device)


def setup(config: Config, run_dir: Path, resume: bool, overwrite: bool) -> Run:
    """Everything a run needs, on this rank's device; with ``resume``, as RUN_DIR/last.pt left it."""
    runtime = setup_runtime(config.train.device, config.train.precision)
    # the refusals that need no tokenizer come before the run folder is written; the rest are undone
    source = load_source(config.train.init_from) if config.train.init_from else None  # fine-tuning
    if source and not resume:
        check_source(source, config.train)
    config = with_source_model(config, source) if source else config
    last = run_dir / "last.pt"
    resumed = resumable(last, config, runtime) if resume else None
    parts = parts_of(config.data)  # data.corpora, or the one corpus
    loaded = load_parts(parts, config.eval)  # each with its fingerprint, the cache's key (files checked)
    with undone_if_refused(run_dir, runtime):  # a refused run leaves its folder as it was
        prepare_run_dir(config, run_dir, runtime, resume, overwrite)
        torch.manual_seed(config.train.seed)
        tokenizer = run_tokenizer(run_dir, loaded, user_symbols(parts), config, runtime, source)
        prefixes = [prefix_ids(part, parts, tokenizer) for part in parts]
        stores = [train_store(one.corpus["train"], one.fingerprint, tokenizer, one.part.data, runtime)
                  for one in loaded]  # fmt: skip
        splits = encode_corpus(loaded, stores, prefixes, tokenizer, config)
        model = build_model(config, tokenizer).to(runtime.device)  # the same weights on every rank
        model = speed_up(model) if config.train.fast else model  # the fast tier's twins, or the plain model
        if runtime.rank:  # but each rank its own dropout masks
            torch.manual_seed(config.train.seed + 1_000_003 * runtime.rank)
        run = Run(
            config, run_dir, runtime, tokenizer, splits, model,
            optimizer=make_optimizer(model, config.train),
            scaler=torch.amp.GradScaler(runtime.device.type, enabled=runtime.dtype == torch.float16),
            ema=EMA(model, config.train.ema_decay) if config.train.ema_decay > 0 else None,
            state=State(),
        )  # fmt: skip
        if source and not resume:
            run.state.step = start_from(source, model, run.optimizer, config.train)
            run.ema = EMA(model, config.train.ema_decay) if config.train.ema_decay > 0 else None
            if run.ema is not None and source.ema is not None and not config.train.reset_optimizer:
                run.ema.load_state_dict(source.ema)  # the source's average goes on, as with --resume
        if resumed is not None:
            parts = run.optimizer, run.scaler, run.ema, runtime.rank
            run.state = State(**restore_training(resumed, last, model, *parts))
            del resumed
        run.state.world_size, run.state.precision = runtime.world_size, runtime.precision
        if len(splits.train_indices) == 0:
            raise DataError(f"no training pair is left: {cleaning_line(splits.cleaning, config.data)}")
    run.started = time.perf_counter() - run.state.train_seconds
    if config.train.max_minutes > 0:  # the same on every rank, until their first vote on the clock
        run.clock_used = run.state.train_seconds / (60.0 * config.train.max_minutes)
    run.never_produced = model.never_produced
    run.model = distributed(model, runtime)
    if runtime.is_main:
        run.writer = reporting.open_writer(run_dir, config)
        print(cleaning_line(splits.cleaning, config.data), flush=True)
        if config.data.corpora:
            print(mixture_line(loaded, splits), flush=True)
        print(
            reporting.setup_line(model, runtime, len(splits.train_indices), tokenizer.vocab_size), flush=True
        )
        if (slow := slow_precision(config.train.precision, runtime.device)) is not None:
            print(f"warning: train.precision={config.train.precision}: {slow}", file=sys.stderr, flush=True)
    return run


def resumable(last: Path, config: Config, runtime: Runtime) -> dict:
    """RUN_DIR/last.pt, checked against ``config`` (``check_resumable``); says which settings it changes."""
    resumed = load_checkpoint(last)
    check_resumable(resumed, last, config, runtime.world_size, runtime.precision)
    if runtime.is_main and (changes := changed_settings(resumed, config)):
        print(f"resuming with {', '.join(changes)} (a resume checks only {RESUME_CHECKS})")
    return resumed


def distributed(model: torch.nn.Module, runtime: Runtime) -> torch.nn.Module:
    """``model`` wrapped for data parallelism over several ranks; one rank: ``model`` itself."""
    if runtime.world_size == 1:
        return model
    # the buffers (position tables) are the same on every rank: no need to sync them every forward
    ddp = torch.nn.parallel.DistributedDataParallel
    no_sync = (
        "forward_sync_buffers" if "forward_sync_buffers" in signature(ddp).parameters else "broadcast_buffers"
    )
    return ddp(model, **{no_sync: False})


def save(run: Run, *names: str) -> dict | None:
    """RUN_DIR/<name> for each name, on rank 0 (see ``training_checkpoint``); returns the checkpoint there.
    Every rank must call it (each rank's RNG state goes in), whatever names it passes."""
    check_finite(run, run.state.step)  # never save weights a deferred non-finite check would refuse
    run.state.train_seconds = time.perf_counter() - run.started
    rng_states = run.runtime.gather(rng_state(run.runtime.device))
    if run.runtime.is_main:
        parts = run.model, run.optimizer, run.scaler, run.ema, run.config, run.tokenizer
        checkpoint = training_checkpoint(*parts, dict(vars(run.state)), rng_states)
        save_checkpoint(checkpoint, run.run_dir / names[0])
        for name in names[1:]:  # the same bytes: written once (a checkpoint holds the weights three times)
            link_checkpoint(run.run_dir / names[0], run.run_dir / name)
        return checkpoint


def check_finite(run: Run, step: int) -> None:
    """train.nonfinite_loss = stop: a TrainingError if a loss or gradient was non-finite since the last check
    (at the latest at ``step``); the last checkpoint on disk is from before it."""
    bad = run.nonfinite is not None and bool(run.nonfinite)
    if run.runtime.max_over_ranks(int(bad)):  # every rank stops together (in fp16 a rank can see it alone)
        last = run.run_dir / "last.pt"
        kept = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint yet"
        raise TrainingError(f"non-finite loss or gradient norm at step {step} or before; stopped: {kept}")
    run.nonfinite = None
