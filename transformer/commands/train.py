"""Train a Transformer translation model and report BLEU — the training story, top to bottom.

    transformer-mt train --config multi30k_de_en [--run-dir DIR] [--set train.max_steps=200 ...]
                         [--resume | --overwrite] [--data-dir DIR]      # in a checkout: python train.py ...
    torchrun --nproc_per_node=N train.py ...        # data-parallel on N GPUs (NCCL) or CPU processes (gloo)

The story: ``setup`` (transformer/training/run.py: corpus, tokenizer, model, optimizer, run folder) ->
per update ``accumulate_gradients`` and ``optimizer_step`` -> ``evaluate_and_save`` every
``eval.every_steps`` -> ``stop_reason`` -> ``final_test`` with best.pt (or the averaged checkpoints) ->
results.json.
"""

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from transformer.core.batches import Batch, iter_batches, make_batches
from transformer.core.checkpoint import CheckpointError
from transformer.core.config import ConfigError
from transformer.core.loss import token_loss
from transformer.core.optim import cooldown_factor, learning_rate, lr_scale
from transformer.fast.output_loss import output_loss
from transformer.interop.formats import load_model
from transformer.runtime.configs import Config, load_config
from transformer.runtime.lines import DataError
from transformer.runtime.precision import DeviceError
from transformer.runtime.usage import UsageParser, command_name
from transformer.training import reporting
from transformer.training.averaging import average_last
from transformer.training.prefetch import prefetch
from transformer.training.ranks import shard, unwrap
from transformer.training.run import Run, TrainingError, check_finite, save, setup
from transformer.training.run_folder import RunFolderError, keep_step_checkpoint, write_results
from transformer.training.splits import lengths_of
from transformer.training.update import scaled_step, unscale_and_clip
from transformer.training.validation import score_other_test_sets, score_test_set, validate

STOP_REASONS = (None, "max_steps", "max_epochs", "max_minutes", "patience")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = UsageParser(prog=command_name("train"), description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", required=True, help="a YAML file, or the name of one in transformer/configs/ (e.g. tiny)"
    )
    parser.add_argument("--run-dir", default=None, help="output folder (default runs/<config name>)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    fresh_or_not = parser.add_mutually_exclusive_group()
    fresh_or_not.add_argument("--resume", action="store_true", help="continue from RUN_DIR/last.pt")
    fresh_or_not.add_argument("--overwrite", action="store_true", help="remove the run RUN_DIR holds, first")
    parser.add_argument("--data-dir", default=None, help="local Multi30k folder (else $MULTI30K_DIR)")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------ one optimisation step
def epoch_batches(run: Run) -> Iterator[Batch]:
    """This rank's batches of the current epoch, from where the state says the epoch stands."""
    state, src_ids, tgt_ids = run.state, *run.splits.train
    batches = make_batches(
        lengths_of(src_ids), lengths_of(tgt_ids), run.config.data.max_tokens, True, run.config.train.seed,
        state.epoch, indices=run.splits.epoch_indices(run.config.train.seed, state.epoch),
    )  # fmt: skip
    batches = shard(batches, run.runtime.rank, run.runtime.world_size)
    return iter_batches(src_ids, tgt_ids, batches[state.batch_in_epoch :], *unwrap(run.model).pad_start_eos)


def accumulate_gradients(run: Run, train_model: torch.nn.Module, batches: list[Batch]) -> torch.Tensor:
    """Forward + backward over the micro-batches of one update. Their summed loss is divided by all their
    target tokens, on every rank together, as if they were one batch (label smoothing inside, §5.4).
    Returns this rank's part of the update's loss per target token."""
    rt, never, pad_id = run.runtime, run.never_produced, unwrap(run.model).pad_id
    # the fast loss applies the output layer, by blocks of rows, outside DDP's forward: fine for DDP as long
    # as find_unused_parameters stays off (its gradient arrives in the same backward pass)
    proj, eps, fast = unwrap(run.model).output_proj, run.config.train.label_smoothing, run.config.train.fast
    n_local = float(sum(b.n_tgt_tokens for b in batches))  # a device tensor only when ranks must add theirs
    n_tokens = n_local if rt.world_size == 1 else rt.sum_over_ranks(torch.full((), n_local, device=rt.device))
    step_loss = torch.zeros((), device=rt.device)
    train_model.train()
    for i, batch in enumerate(batches):
        batch = batch.to(rt.device, non_blocking=True)
        last = i == len(batches) - 1  # DDP averages the gradients over ranks once, after the last one
        with run.model.no_sync() if rt.world_size > 1 and not last else contextlib.nullcontext():
            with rt.autocast():
                if fast:
                    features = train_model(batch.src, batch.tgt_in, project=False)  # (B, T, D)
                    loss = output_loss(features, proj, batch.tgt_out, pad_id, eps, never) / n_tokens
                else:
                    logits = train_model(batch.src, batch.tgt_in)  # (B, T, V)
                    loss = token_loss(logits, batch.tgt_out, pad_id, eps, never) / n_tokens
            run.scaler.scale(loss * rt.world_size if rt.world_size > 1 else loss).backward()
        step_loss += loss.detach()
        run.state.train_tokens += batch.n_tgt_tokens
    return step_loss


def optimizer_step(run: Run, loss: torch.Tensor) -> tuple[float, torch.Tensor] | None:
    """Clip, check, update at the §5.3 learning rate. Returns (lr, grad norm), or None if skipped."""
    tc, state, d_model = run.config.train, run.state, run.config.model.d_model
    grad_norm = unscale_and_clip(run.model, run.optimizer, run.scaler, tc.clip_grad_norm)
    # in fp16 an overflowing gradient is routine: the scaler skips that update and lowers its scale
    bad = ~torch.isfinite(loss) | (~torch.isfinite(grad_norm) & (not run.scaler.is_enabled()))
    run.nonfinite = bad if run.nonfinite is None else run.nonfinite | bad  # no device sync
    if tc.nonfinite_loss == "skip" and bool(bad):
        run.optimizer.zero_grad(set_to_none=True)
        run.nonfinite = None
        print(f"skipping step {state.step + 1}: non-finite loss or gradient", file=sys.stderr)
        run.scaler.update()
        return None
    if tc.sync_every == 1:
        check_finite(run, state.step + 1)  # before this update; else caught within sync_every steps
    lr = learning_rate(state.step + 1, d_model, tc.warmup_steps, lr_scale(tc, d_model))
    lr *= cooldown_factor(budget_used(run), tc.cooldown)
    if not scaled_step(run.optimizer, run.scaler, lr):
        return None  # fp16 overflow: the scaler skipped this update
    state.step += 1
    if run.ema is not None:
        run.ema.update(unwrap(run.model))
    return lr, grad_norm


def budget_used(run: Run) -> float:
    """The fraction of the budget spent before the coming update: the larger of steps / max_steps and
    minutes / max_minutes. Under torchrun the ranks agree on the clock's fraction every train.sync_every
    steps."""
    tc, rt = run.config.train, run.runtime
    if tc.cooldown <= 0:
        return 0.0
    steps = run.state.step / tc.max_steps if tc.max_steps else 0.0
    if tc.max_minutes > 0 and (rt.world_size == 1 or run.state.step % tc.sync_every == 0):
        clock = (time.perf_counter() - run.started) / (tc.max_minutes * 60.0)
        run.clock_used = rt.max_over_ranks(round(clock * 1e6)) / 1e6  # the same lr on every rank
    return max(steps, run.clock_used)


def stop_reason(run: Run) -> str | None:
    """Why training should stop now, if it should: the same answer on every rank."""
    tc, state, reason = run.config.train, run.state, None
    if tc.max_steps and state.step >= tc.max_steps:
        return "max_steps"
    if tc.max_epochs and state.epoch >= tc.max_epochs:
        return "max_epochs"
    if run.runtime.world_size > 1 and state.step % tc.sync_every:
        return None  # the ranks vote every train.sync_every steps
    if tc.max_minutes > 0 and time.perf_counter() - run.started >= tc.max_minutes * 60.0:
        reason = "max_minutes"
    elif tc.patience and state.bad_evals >= tc.patience:
        reason = "patience"  # known on rank 0
    # clocks differ between processes: the first rank to stop decides
    return STOP_REASONS[run.runtime.max_over_ranks(STOP_REASONS.index(reason))]


# ------------------------------------------------------------------------------------- evaluation
def evaluate_and_save(run: Run) -> None:
    """Validation loss and greedy BLEU (with the moving average, if any) on rank 0, logged; best.pt when
    ``eval.select_by`` improves; step_<S>.pt for averaging (``train.keep_last``); last.pt always."""
    state, rt, tc, select_by = run.state, run.runtime, run.config.train, run.config.eval.select_by
    check_finite(run, state.step)  # do not validate (or keep) weights a deferred check would refuse
    names = ["last.pt"]
    if rt.is_main:
        model = unwrap(run.model)
        with run.ema.applied(model) if run.ema is not None else contextlib.nullcontext():
            entry = validate(run, model)
        state.history.append(entry)
        score = -entry["val_loss"] if select_by == "loss" else entry[f"val_{select_by}"]
        state.bad_evals += 1
        if math.isfinite(score) and (state.best_score is None or score > state.best_score):
            state.best_score, state.best_bleu, state.best_step = score, entry["val_bleu"], state.step
            state.bad_evals = 0
            names.append("best.pt")
    rt.wait_for_main()  # the other ranks wait here, however long the validation takes
    checkpoint = save(run, *names)
    if tc.keep_last and rt.is_main:
        keep_step_checkpoint(run.run_dir, checkpoint, state.step, tc.keep_last)


# -------------------------------------------------------------------------------------- the loop
def train_loop(run: Run) -> str:
    """Optimisation steps, with evaluate-and-save on schedule, until a stop rule fires; returns which."""
    tc, state, rt = run.config.train, run.state, run.runtime
    train_model = torch.compile(run.model, dynamic=True) if tc.compile else run.model
    progress = tqdm(
        desc="train", initial=state.step, total=tc.max_steps or None, disable=not rt.is_main,
        mininterval=1.0 if sys.stderr.isatty() else 30.0, dynamic_ncols=True,
    )  # fmt: skip
    window_tokens, window_start, micro_batches = 0, time.perf_counter(), []  # for tokens/s; the update's
    reason = stop_reason(run)
    if reason is None and state.pending_from:  # resumed inside an update: read its micro-batches again
        state.epoch, state.batch_in_epoch = state.pending_from
        state.pending_from = None
    while reason is None:
        for batch in prefetch(epoch_batches(run), rt.device):
            if not micro_batches:  # where this update starts: what --resume reads again if it is pending
                update_start = (state.epoch, state.batch_in_epoch)
            state.batch_in_epoch += 1
            if len(micro_batches := micro_batches + [batch]) < tc.accum_steps:
                continue  # accumulating (across epochs too)
            loss = accumulate_gradients(run, train_model, micro_batches)
            window_tokens, micro_batches = window_tokens + sum(b.n_tgt_tokens for b in micro_batches), []
            if (update := optimizer_step(run, loss)) is None:
                continue  # skipped: non-finite (train.nonfinite_loss = skip) or an fp16 overflow
            progress.update(1)
            if state.step % tc.sync_every == 0:
                check_finite(run, state.step)
            if state.step % tc.log_every == 0:
                step_loss = rt.sum_over_ranks(loss)  # the whole update's loss per target token
                tokens_per_s = window_tokens * rt.world_size / (time.perf_counter() - window_start)
                if rt.is_main:
                    reporting.log_train_step(
                        run.writer, progress, state.step, step_loss, *update, tokens_per_s
                    )
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
    if micro_batches:  # stopped at an epoch end inside an update: --resume starts at its first micro-batch
        state.pending_from = list(update_start)
    every = run.config.eval.every_steps
    if state.step == 0 or not every or state.step % every:  # the last step is not evaluated yet (all ranks)
        evaluate_and_save(run)
    return reason


def final_test(run: Run, stop_reason: str) -> dict:
    """Decode the test set with best.pt, or with the average of the last ``eval.average_last`` evaluation
    checkpoints (§6.1); write and return results.json (rank 0)."""
    rt, config = run.runtime, run.config
    tested = run.run_dir / "best.pt"
    if config.eval.average_last:
        tested = average_last(
            run.run_dir, config.eval.average_last, config.eval.average_weights, has_ema=run.ema is not None
        )
    model, tokenizer, _ = load_model(tested, rt.device)
    t0 = time.perf_counter()
    hyps, scores, by_corpus = score_test_set(run, model, tokenizer)
    seconds, params = time.perf_counter() - t0, sum(p.numel() for p in model.parameters())
    results = reporting.run_results(
        scores, config, run.state, stop_reason, rt.world_size, tested=tested.name,
        test_decode_seconds=seconds, parameters=params, device=str(rt.device), precision=rt.precision,
        data_cleaning=run.splits.cleaning, test_sets=score_other_test_sets(run, model, tokenizer),
        **({"test_corpora": by_corpus} if by_corpus else {}),
    )  # fmt: skip
    write_results(run.run_dir, results, hyps)
    print(reporting.test_line(results), flush=True)
    reporting.log_test(run.writer, config, results, run.state.step)
    return results


def train(config: Config, run_dir: Path, resume: bool = False, overwrite: bool = False) -> dict | None:
    """The whole job; returns results.json's contents (on rank 0)."""
    run = setup(config, run_dir, resume, overwrite)
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
        train(config, run_dir, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, DataError, CheckpointError, TrainingError, DeviceError, RunFolderError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
