"""Train a Transformer translation model and report BLEU — the training story, top to bottom.

    python train.py --config configs/multi30k_de_en.yaml [--run-dir DIR] [--set train.max_steps=200 ...]
                    [--resume] [--data-dir DIR]
    torchrun --nproc_per_node=N train.py ...        # data-parallel on N GPUs (NCCL) or CPU processes (gloo)

The story: setup -> steps (forward + backward, optimizer step, log) with evaluate-and-save every
``eval.every_steps`` -> stop decision -> test with best.pt -> results.json (see ``run_folder.py``).
"""

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from transformer import reporting
from transformer.checkpoint import (
    CheckpointError,
    build_model,
    load_for_inference,
    restore_training,
    save_checkpoint,
    training_checkpoint,
    unwrap,
)
from transformer.config import Config, ConfigError, load_config
from transformer.corpus import DataError, load_corpus
from transformer.data import Batch, Splits, encode_corpus, iter_batches, make_batches
from transformer.ema import EMA
from transformer.evaluation import token_loss, translate_and_score
from transformer.optim import learning_rate, lr_scale, make_optimizer, scaled_step, unscale_and_clip
from transformer.run_folder import RunFolderError, prepare_run_dir, run_tokenizer, write_results
from transformer.runtime import DeviceError, Runtime, setup_runtime
from transformer.tokenizer import Tokenizer

STOP_REASONS = (None, "max_steps", "max_epochs", "max_minutes")  # in the order of the stop decision


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, unwritable run folder, ...); the message says why."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file in configs/")
    parser.add_argument("--run-dir", default=None, help="output folder (default runs/<config name>)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--resume", action="store_true", help="continue from RUN_DIR/last.pt")
    parser.add_argument("--data-dir", default=None, help="local Multi30k folder (else $MULTI30K_DIR)")
    return parser.parse_args(argv)


@dataclass
class State:
    """Where training stands; saved in every checkpoint so that --resume continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    best_bleu: float = -1.0
    best_step: int = 0
    train_tokens: int = 0
    train_seconds: float = 0.0
    history: list = field(default_factory=list)


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


# ------------------------------------------------------------------------------------------- setup
def setup(config: Config, run_dir: Path, resume: bool) -> Run:
    runtime = setup_runtime(config.train.device, config.train.precision)
    corpus = load_corpus(config.data)  # before the run folder: bad data leaves nothing behind
    prepare_run_dir(config, run_dir, runtime)
    torch.manual_seed(config.train.seed)
    tokenizer = run_tokenizer(run_dir, corpus["train"], config, runtime)
    splits = encode_corpus(corpus, tokenizer, config.data)
    model = build_model(config.model, tokenizer).to(runtime.device)
    run = Run(
        config, run_dir, runtime, tokenizer, splits, model,
        optimizer=make_optimizer(model, config.train),
        scaler=torch.amp.GradScaler(runtime.device.type, enabled=runtime.dtype == torch.float16),
        ema=EMA(model, config.train.ema_decay) if config.train.ema_decay > 0 else None,
        state=State(),
    )  # fmt: skip
    if resume:
        run.state = State(
            **restore_training(run_dir / "last.pt", model, run.optimizer, run.scaler, run.ema, config)
        )
    run.started = time.perf_counter() - run.state.train_seconds
    if runtime.world_size > 1:
        run.model = torch.nn.parallel.DistributedDataParallel(model)
    if runtime.is_main:
        run.writer = reporting.open_writer(run_dir, config)
        print(reporting.setup_line(model, runtime, len(splits.train_indices), tokenizer.vocab_size))
    return run


def save(run: Run, name: str) -> None:
    """RUN_DIR/name on rank 0 (see ``training_checkpoint``)."""
    run.state.train_seconds = time.perf_counter() - run.started
    if run.runtime.is_main:
        parts = run.model, run.optimizer, run.scaler, run.ema, run.config, run.tokenizer
        save_checkpoint(training_checkpoint(*parts, dict(vars(run.state))), run.run_dir / name)


# -------------------------------------------------------------------------------------- one step
def epoch_batches(run: Run) -> Iterator[Batch]:
    """This rank's batches of the current epoch, from where the state says the epoch stands."""
    state, src_ids, tgt_ids = run.state, *run.splits.train
    batches = make_batches(
        [len(s) for s in src_ids], [len(t) for t in tgt_ids], run.config.data.max_tokens, True,
        run.config.train.seed, state.epoch, run.runtime.rank, run.runtime.world_size,
        indices=run.splits.train_indices,
    )  # fmt: skip
    yield from iter_batches(src_ids, tgt_ids, batches[state.batch_in_epoch :], *run.tokenizer.pad_bos_eos)


def forward_backward(run: Run, train_model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Loss per target token of one (micro-)batch, label smoothing inside (§5.4); gradients accumulate."""
    train_model.train()
    batch = batch.to(run.runtime.device)
    with run.runtime.autocast():
        logits = train_model(batch.src, batch.tgt_in)  # (B, T, V)
    tc = run.config.train
    loss = token_loss(logits, batch.tgt_out, run.tokenizer.pad_id, tc.label_smoothing) / batch.n_tgt_tokens
    run.scaler.scale(loss / tc.accum_steps).backward()
    run.state.batch_in_epoch += 1
    run.state.train_tokens += batch.n_tgt_tokens
    return loss


def optimizer_step(run: Run, loss: torch.Tensor) -> tuple[float, torch.Tensor] | None:
    """Clip, check, update at the §5.3 learning rate. Returns (lr, grad norm), or None if skipped."""
    tc, state, d_model = run.config.train, run.state, run.config.model.d_model
    grad_norm = unscale_and_clip(run.model, run.optimizer, run.scaler, tc.clip_grad_norm)
    # in fp16 an overflowing gradient is routine: the scaler skips that update and lowers its scale
    if not (torch.isfinite(loss) and (run.scaler.is_enabled() or torch.isfinite(grad_norm))):
        run.optimizer.zero_grad(set_to_none=True)
        if tc.nonfinite_loss == "stop":
            last = run.run_dir / "last.pt"
            kept = (
                f"stopped: the last good checkpoint is {last}"
                if last.exists()
                else "stopped: no checkpoint yet"
            )
            raise TrainingError(
                f"non-finite loss ({loss.item()}) or gradient norm at step {state.step + 1}; {kept}"
            )
        print(f"skipping step {state.step + 1}: non-finite loss or gradient", file=sys.stderr)
        run.scaler.update()
        return None
    lr = learning_rate(state.step + 1, d_model, tc.warmup_steps, lr_scale(tc, d_model))
    if not scaled_step(run.optimizer, run.scaler, lr):
        return None  # fp16 overflow: the scaler skipped this update
    state.step += 1
    if run.ema is not None:
        run.ema.update(unwrap(run.model))
    return lr, grad_norm


def stop_reason(run: Run) -> str | None:
    """Why training should stop now, if it should: the same answer on every rank."""
    tc, state = run.config.train, run.state
    reason = None
    if tc.max_steps and state.step >= tc.max_steps:
        reason = "max_steps"
    elif tc.max_epochs and state.epoch >= tc.max_epochs:
        reason = "max_epochs"
    elif tc.max_minutes > 0 and time.perf_counter() - run.started >= tc.max_minutes * 60.0:
        reason = "max_minutes"
    # clocks differ between processes: the first rank to stop decides
    return STOP_REASONS[run.runtime.max_over_ranks(STOP_REASONS.index(reason))]


# ------------------------------------------------------------------------------------- evaluation
def evaluate_and_save(run: Run) -> None:
    """Validation loss and greedy BLEU (with the moving average, if any) on rank 0, logged; best.pt when
    the BLEU improves; last.pt always."""
    state, rt = run.state, run.runtime
    if rt.is_main:
        model = unwrap(run.model)
        with run.ema.applied(model) if run.ema is not None else contextlib.nullcontext():
            args = (run.splits, run.tokenizer, run.config.eval, rt, run.writer, state.step, state.epoch)
            entry = reporting.validate(model, *args)
        state.history.append(entry)
        if entry["val_bleu"] > state.best_bleu:
            state.best_bleu, state.best_step = entry["val_bleu"], entry["step"]
            save(run, "best.pt")
    save(run, "last.pt")


# -------------------------------------------------------------------------------------- the loop
def train_loop(run: Run) -> str:
    """Optimisation steps, with evaluate-and-save on schedule, until a stop rule fires; returns which."""
    tc, state, is_main = run.config.train, run.state, run.runtime.is_main
    train_model = torch.compile(run.model, dynamic=True) if tc.compile else run.model
    progress = tqdm(
        desc="train", initial=state.step, total=tc.max_steps or None, disable=not is_main,
        mininterval=1.0 if sys.stderr.isatty() else 30.0, dynamic_ncols=True,
    )  # fmt: skip
    window_tokens, window_start, micro = 0, time.perf_counter(), 0  # for tokens/s; micro-batches so far
    reason = stop_reason(run)
    while reason is None:
        for batch in epoch_batches(run):
            loss = forward_backward(run, train_model, batch)
            window_tokens, micro = window_tokens + batch.n_tgt_tokens, micro + 1
            if micro % tc.accum_steps or (update := optimizer_step(run, loss)) is None:
                continue  # accumulating, or the update was skipped
            progress.update(1)
            if state.step % tc.log_every == 0 and is_main:
                tokens_per_s = window_tokens * run.runtime.world_size / (time.perf_counter() - window_start)
                reporting.log_train_step(run.writer, progress, state.step, loss, *update, tokens_per_s)
                window_tokens, window_start = 0, time.perf_counter()
            if tc.checkpoint_every and state.step % tc.checkpoint_every == 0:
                save(run, "last.pt")
            if run.config.eval.every_steps and state.step % run.config.eval.every_steps == 0:
                evaluate_and_save(run)
            if (reason := stop_reason(run)) is not None:
                break
        else:
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            reason = stop_reason(run)
    progress.close()
    if not state.history or state.history[-1]["step"] != state.step:
        evaluate_and_save(run)
    else:
        save(run, "last.pt")
    return reason


def final_test(run: Run, stop_reason: str) -> dict:
    """Decode the test set with best.pt; write and return results.json (rank 0)."""
    rt, config, (src_ids, _), refs = run.runtime, run.config, run.splits.test, run.splits.test_refs
    model, tokenizer, _ = load_for_inference(run.run_dir / "best.pt", rt.device)
    t0 = time.perf_counter()
    _, hyps, scores = translate_and_score(
        model, src_ids, refs, tokenizer, rt.device, rt.autocast, config.eval, "test"
    )
    seconds, params = time.perf_counter() - t0, sum(p.numel() for p in model.parameters())
    results = reporting.run_results(
        scores, config, run.state, stop_reason, rt.world_size,
        test_decode_seconds=seconds, parameters=params, device=str(rt.device),
    )  # fmt: skip
    write_results(run.run_dir, results, hyps)
    print(reporting.test_line(results), flush=True)
    reporting.log_test(run.writer, config, results, run.state.step)
    return results


def train(config: Config, run_dir: Path, resume: bool = False) -> dict | None:
    """The whole job; returns results.json's contents (on rank 0)."""
    run = setup(config, run_dir, resume)
    reason = train_loop(run)
    results = final_test(run, reason) if run.runtime.is_main else None
    if run.writer is not None:
        run.writer.close()
    run.runtime.close()
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        overrides = list(args.set) + ([f"data.data_dir={args.data_dir}"] if args.data_dir else [])
        config = load_config(args.config, overrides)
        run_dir = Path(args.run_dir or Path("runs") / Path(args.config).stem)
        if args.resume and not (run_dir / "last.pt").is_file():
            raise TrainingError(f"--resume: no checkpoint {run_dir / 'last.pt'} to resume from")
        train(config, run_dir, resume=args.resume)
    except (ConfigError, DataError, CheckpointError, TrainingError, DeviceError, RunFolderError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
