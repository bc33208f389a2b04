"""A training run's objects and their checkpoints: ``setup`` builds everything ``train.py``'s loop needs
(corpus, tokenizer, model, optimizer, run folder, TensorBoard writer) into one ``Run``; ``save`` writes it.

``State`` is where training stands; it goes into every checkpoint so that ``--resume`` continues exactly.
"""

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from inspect import signature
from pathlib import Path

import torch

from transformer import reporting
from transformer.checkpoint import (
    CheckpointError,
    link_checkpoint,
    restore_training,
    rng_state,
    save_checkpoint,
    training_checkpoint,
)
from transformer.config import Config
from transformer.corpus import DataError, load_corpus, load_test_sets
from transformer.data import Splits, cleaning_line, encode_corpus, iter_batches, make_batches
from transformer.data_cache import train_store
from transformer.ema import EMA
from transformer.evaluation import evaluate_loss
from transformer.init_from import load_source, start_from, with_source_model
from transformer.model import Transformer, build_model
from transformer.optim import make_optimizer
from transformer.run_folder import prepare_run_dir, run_tokenizer
from transformer.runtime import Runtime, setup_runtime, slow_precision
from transformer.tokenizer import Tokenizer
from transformer.translator import Translator


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
    never_targets: list[int] = field(default_factory=list)  # model.never_produced: no smoothing mass
    nonfinite: torch.Tensor | None = None  # a non-finite loss or gradient since the last check (device)


def setup(config: Config, run_dir: Path, resume: bool, overwrite: bool) -> Run:
    """Everything a run needs, on this rank's device; with ``resume``, as RUN_DIR/last.pt left it."""
    runtime = setup_runtime(config.train.device, config.train.precision)
    source = load_source(config.train.init_from) if config.train.init_from else None  # fine-tuning
    config = with_source_model(config, source) if source else config
    corpus = load_corpus(config.data)  # before the run folder: bad data leaves nothing behind
    corpus |= load_test_sets(config.eval.test_sets, config.data)
    fingerprint = corpus["train"].fingerprint()  # the training files' SHA-256: the cache's key; checks them
    prepare_run_dir(config, run_dir, runtime, resume, overwrite)
    torch.manual_seed(config.train.seed)
    tokenizer = run_tokenizer(run_dir, corpus["train"], fingerprint, config, runtime, source)
    store = train_store(corpus["train"], fingerprint, tokenizer, config.data, runtime)
    splits = encode_corpus(corpus, tokenizer, config, store)
    model = build_model(config.model, tokenizer).to(runtime.device)  # the same weights on every rank
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
    if resume:
        parts = run.optimizer, run.scaler, run.ema, config, runtime.rank
        run.state = State(**restore_training(run_dir / "last.pt", model, *parts))
        if run.state.world_size != runtime.world_size:
            raise CheckpointError(
                f"{run_dir / 'last.pt'} was trained by {run.state.world_size} processes; resume with as many"
            )
        if run.state.precision not in (None, runtime.precision):
            raise CheckpointError(
                f"{run_dir / 'last.pt'} was trained in {run.state.precision}; train.precision="
                f"{config.train.precision} is {runtime.precision} here: resume with --set "
                f"train.precision={run.state.precision}"
            )
    run.state.world_size, run.state.precision = runtime.world_size, runtime.precision
    if len(splits.train_indices) == 0:
        raise DataError(f"no training pair is left: {cleaning_line(splits.cleaning, config.data)}")
    run.started = time.perf_counter() - run.state.train_seconds
    if config.train.max_minutes > 0:  # the same on every rank, until their first vote on the clock
        run.clock_used = run.state.train_seconds / (60.0 * config.train.max_minutes)
    run.never_targets = model.never_produced
    if runtime.world_size > 1:
        # the buffers (position tables) are the same on every rank: no need to sync them every forward
        ddp = torch.nn.parallel.DistributedDataParallel
        no_sync = (
            "forward_sync_buffers"
            if "forward_sync_buffers" in signature(ddp).parameters
            else "broadcast_buffers"
        )
        run.model = ddp(model, **{no_sync: False})
    if runtime.is_main:
        run.writer = reporting.open_writer(run_dir, config)
        print(cleaning_line(splits.cleaning, config.data), flush=True)
        print(
            reporting.setup_line(model, runtime, len(splits.train_indices), tokenizer.vocab_size), flush=True
        )
        if (slow := slow_precision(config.train.precision, runtime.device)) is not None:
            print(f"warning: train.precision={config.train.precision}: {slow}", file=sys.stderr, flush=True)
    return run


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
        for name in names[1:]:  # the same bytes: written once (a 7.6M-parameter run's is ~170 MB)
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


def validate(run: Run, model: Transformer) -> dict:
    """Validation loss and greedy BLEU / chrF of ``model`` (rank 0), logged and printed, with the attention
    heatmaps of the first ``eval.n_alignment_sentences`` sentences; returns the history entry."""
    t0, settings, state = time.perf_counter(), run.config.eval, run.state
    (src_ids, tgt_ids), refs = run.splits.valid, run.splits.valid_refs
    greedy = dataclasses.replace(settings, beam_size=1)
    translator = Translator(model, run.tokenizer, greedy, run.runtime.device, run.runtime.precision)
    batches = make_batches([len(s) for s in src_ids], [len(t) for t in tgt_ids], settings.max_tokens, False)
    loss = evaluate_loss(
        model, iter_batches(src_ids, tgt_ids, batches, *model.pad_start_eos), run.runtime.device,
        run.runtime.autocast,  # the loss as training computes it (the translator may decode a bf16 copy)
    )  # fmt: skip
    hyp_ids, hyps, scores = translator.evaluate(src_ids, refs, progress="validate")
    entry = {"step": state.step, "epoch": state.epoch}
    entry |= {f"val_{key}": (loss | scores)[key] for key in ("loss", "ppl", "bleu", "chrf")}
    attentions = {}
    for n in range(min(settings.n_alignment_sentences, len(src_ids))):
        ended = translator.ended(src_ids[n], hyp_ids[n])
        attentions[f"sentence_{n}"] = translator.attention_ids(src_ids[n], hyp_ids[n], ended)
        if settings.alignment_references:  # the reference, teacher-forced
            attentions[f"sentence_{n}/reference"] = translator.attention_ids(src_ids[n], tgt_ids[n], True)
    n_samples = min(settings.n_sample_translations, len(hyps))
    sources = run.tokenizer.decode_batch(src_ids[:n_samples])
    reporting.log_validation(run.writer, entry, list(zip(sources, refs, hyps)), attentions)
    print(reporting.validation_line(entry, time.perf_counter() - t0), flush=True)
    return entry


def test_other_sets(run: Run, translator: Translator) -> dict[str, dict]:
    """``eval.test_sets``, each decoded like the test set: {name: BLEU, chrF, signature, sentences}, logged
    to TensorBoard (test/NAME/bleu, .../chrf) and written to RUN_DIR/test_hypotheses.NAME.txt (rank 0)."""
    results = {}
    for name, ((src_ids, _), refs) in run.splits.other_tests.items():
        _, hyps, scores = translator.evaluate(src_ids, refs, progress=f"test {name}")
        results[name] = scores | {"sentences": len(refs)}
        (run.run_dir / f"test_hypotheses.{name}.txt").write_text("".join(h + "\n" for h in hyps), "utf-8")
        for metric in ("bleu", "chrf"):
            run.writer.add_scalar(f"test/{name}/{metric}", scores[metric], run.state.step)
        print(f"test set {name}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}", flush=True)
    return results
