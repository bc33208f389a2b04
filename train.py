"""Train a Transformer translation model and report BLEU — the training story, top to bottom.

    python train.py --config configs/multi30k_de_en.yaml [--run-dir DIR] [--set train.max_steps=200 ...]
                    [--resume] [--data-dir DIR]
    torchrun --nproc_per_node=N train.py ...        # data-parallel on N GPUs (NCCL) or CPU processes (gloo)

The run folder gets: config.yaml (resolved), tokenizer.model, last.pt / best.pt, TensorBoard events
(``tensorboard --logdir RUN_DIR``: scalars, sample translations, attention heatmaps) and results.json.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from tqdm import tqdm

from transformer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    tokenizer_to_tensor,
    unwrap,
)
from transformer.config import Config, ConfigError, DataConfig, load_config
from transformer.corpus import Splits, encode_corpus, load_corpus
from transformer.data import DataError, iter_batches, make_batches
from transformer.ema import EMA
from transformer.evaluation import bleu_chrf, evaluate_loss, sentence_attention, token_loss, translate_ids
from transformer.model import Transformer
from transformer.optim import learning_rate, lr_scale, make_optimizer, set_lr
from transformer.tokenizer import Tokenizer, train_tokenizer


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, unwritable run folder, ...); the message says why."""


# ------------------------------------------------------------------------------------------- setup


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file in configs/")
    parser.add_argument("--run-dir", default=None, help="output folder (default runs/<config name>)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--resume", action="store_true", help="continue from RUN_DIR/last.pt")
    parser.add_argument("--data-dir", default=None, help="local Multi30k folder (else $MULTI30K_DIR)")
    return parser.parse_args(argv)


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None = fp32
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


def setup_runtime(config: Config) -> Runtime:
    """Device (CUDA when present), precision, TF32, and the process group under torchrun."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    name = config.train.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and world_size > 1:
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    precision = config.train.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return Runtime(device, dtype, rank, world_size)


def build_tokenizer(corpus, data: DataConfig, run_dir: Path, runtime: Runtime) -> Tokenizer:
    """A joint SentencePiece model on both sides of the training split (rank 0), saved with the run."""
    path = run_dir / "tokenizer.model"
    if runtime.is_main and not path.exists():
        pairs = corpus["train"]["translation"]
        sentences = [p[data.src_lang] for p in pairs] + [p[data.tgt_lang] for p in pairs]
        train_tokenizer(sentences, run_dir / "tokenizer", data.vocab_size, data.tokenizer_type)
    if runtime.world_size > 1:
        dist.barrier()
    return Tokenizer(path)


# ---------------------------------------------------------------------------------------- training


@dataclass
class State:
    """Where training stands; saved in every checkpoint so that --resume continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    best_bleu: float = -1.0
    train_tokens: int = 0
    train_seconds: float = 0.0
    history: list = field(default_factory=list)


def checkpoint_state(model, optimizer, scaler, config, tokenizer, state: State, ema: EMA | None) -> dict:
    """``model`` holds the weights to translate with (the moving average when there is one)."""
    model = unwrap(model)
    checkpoint = {
        "config": config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),  # fp16 loss scale; empty when the scaler is off
        "tokenizer": tokenizer_to_tensor(tokenizer),
        "state": dict(vars(state)),
        "rng": {"torch": torch.get_rng_state()}
        | ({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}),
    }
    if ema is not None:
        checkpoint["train_model"] = checkpoint["model"]
        with ema.applied(model):
            checkpoint["model"] = {k: v.clone() for k, v in model.state_dict().items()}
        checkpoint["ema"] = ema.state_dict()
    return checkpoint


def restore(path: Path, model, optimizer, scaler, config: Config, ema: EMA | None) -> State:
    ckpt = load_checkpoint(path)
    saved, now = ckpt["config"], config.to_dict()
    # what decides the weights' shapes and the order of the batches must not change on resume
    changed = [f"model.{k}" for k in now["model"] if saved["model"].get(k) != now["model"][k]]
    changed += [
        f"data.{k}" for k in now["data"] if k != "data_dir" and saved["data"].get(k) != now["data"][k]
    ]
    changed += ["train.seed"] if saved["train"].get("seed") != now["train"]["seed"] else []
    if changed:
        raise CheckpointError(f"{path} was trained with other values of {', '.join(changed)}; cannot resume")
    unwrap(model).load_state_dict(ckpt.get("train_model", ckpt["model"]))
    optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    if ema is not None:
        if "ema" not in ckpt:
            raise CheckpointError(f"{path} has no moving average; cannot resume with train.ema_decay > 0")
        ema.load_state_dict(ckpt["ema"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    if "cuda" in ckpt["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    return State(**ckpt["state"])


def validate(model, splits: Splits, tokenizer, config: Config, runtime: Runtime, writer, state: State):
    """Validation loss + greedy BLEU; samples and attention heatmaps to TensorBoard; returns the BLEU."""
    model = unwrap(model)
    src_ids, tgt_ids = splits.valid
    batches = make_batches(
        [len(s) for s in src_ids], [len(t) for t in tgt_ids], config.eval.max_tokens, False
    )
    ids = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    loss = evaluate_loss(
        model, iter_batches(src_ids, tgt_ids, batches, *ids), runtime.device, runtime.autocast
    )
    hyp_ids = translate_ids(
        model, src_ids, tokenizer, runtime.device, runtime.autocast, config.eval.max_tokens,
        max_len_offset=config.eval.max_len_offset, progress="validate",
    )  # fmt: skip
    hyps = tokenizer.decode_batch(hyp_ids)
    scores = bleu_chrf(hyps, splits.valid_refs)
    entry = {"step": state.step, "epoch": state.epoch, "val_loss": loss["loss"], "val_ppl": loss["ppl"]}
    entry |= {"val_bleu": scores["bleu"], "val_chrf": scores["chrf"]}
    state.history.append(entry)
    if writer is not None:
        for key in ("loss", "ppl", "bleu", "chrf"):
            writer.add_scalar(f"val/{key}", entry[f"val_{key}"], state.step)
        samples = [
            f"**src** {tokenizer.decode(src_ids[i])}  \n**ref** {splits.valid_refs[i]}  \n**hyp** {hyps[i]}"
            for i in range(min(config.eval.n_sample_translations, len(hyps)))
        ]
        writer.add_text("val/translations", "\n\n".join(samples), state.step)
        log_alignments(model, src_ids, hyp_ids, tokenizer, config, runtime, writer, state.step)
    return entry


def log_alignments(model, src_ids, hyp_ids, tokenizer, config, runtime, writer, step) -> None:
    """Cross-attention (and self-attention) heatmaps of a few fixed validation sentences."""
    from transformer.plotting import alignment_figures, figure_to_array

    for n in range(min(config.eval.n_alignment_sentences, len(src_ids))):
        with runtime.autocast():
            attention, src_labels, tgt_labels, in_labels = sentence_attention(
                model, tokenizer, src_ids[n], hyp_ids[n], config.eval.max_len_offset
            )
        figures = alignment_figures([w[0] for w in attention.cross], src_labels, tgt_labels, "cross")
        figures |= alignment_figures(
            [w[0] for w in attention.encoder_self], src_labels, src_labels, "encoder_self", heads=False
        )
        figures |= alignment_figures(
            [w[0] for w in attention.decoder_self], in_labels, in_labels, "decoder_self", heads=False
        )
        for tag, fig in figures.items():
            writer.add_image(f"sentence_{n}/{tag}", figure_to_array(fig), step, dataformats="HWC")


def train(config: Config, run_dir: Path, resume: bool = False) -> dict:
    runtime = setup_runtime(config)
    corpus = load_corpus(config.data)  # before the run folder: bad data leaves nothing behind
    if runtime.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        except OSError as error:
            raise TrainingError(f"cannot write to run folder {run_dir}: {error.strerror}") from None
    torch.manual_seed(config.train.seed)
    tokenizer = build_tokenizer(corpus, config.data, run_dir, runtime)
    splits = encode_corpus(corpus, tokenizer, config.data)
    model = Transformer(config.model, tokenizer.vocab_size, tokenizer.vocab_size, tokenizer.pad_id)
    model.to(runtime.device)
    optimizer = make_optimizer(model, config.train)
    ema = EMA(model, config.train.ema_decay) if config.train.ema_decay > 0 else None
    scaler = torch.amp.GradScaler(runtime.device.type, enabled=runtime.dtype == torch.float16)
    state = restore(run_dir / "last.pt", model, optimizer, scaler, config, ema) if resume else State()
    if runtime.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    train_model = torch.compile(model, dynamic=True) if config.train.compile else model

    writer = None
    if runtime.is_main:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir))
        writer.add_text("config", "```\n" + yaml.safe_dump(config.to_dict(), sort_keys=False) + "\n```", 0)
    n_params = sum(p.numel() for p in unwrap(model).parameters())
    if runtime.is_main:
        print(
            f"{n_params / 1e6:.2f}M parameters on {runtime.device} ({runtime.dtype or 'fp32'}), "
            f"{len(splits.train_indices)} training pairs, vocabulary {tokenizer.vocab_size}",
            flush=True,
        )

    tc, scale = config.train, lr_scale(config.train, config.model.d_model)
    src_lengths = [len(s) for s in splits.train[0]]
    tgt_lengths = [len(t) for t in splits.train[1]]
    ids = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    budget = tc.max_minutes * 60.0 if tc.max_minutes > 0 else math.inf
    started = time.perf_counter() - state.train_seconds
    progress = tqdm(
        desc="train", initial=state.step, total=tc.max_steps or None, disable=not runtime.is_main,
        mininterval=1.0 if sys.stderr.isatty() else 30.0, dynamic_ncols=True,
    )  # fmt: skip
    window_tokens, window_start, micro = 0, time.perf_counter(), 0
    reasons = (None, "max_steps", "max_epochs", "max_minutes")

    def stop_reason_now() -> str | None:
        """Why training should stop now, if it should: the same answer on every rank."""
        reason = None
        if tc.max_steps and state.step >= tc.max_steps:
            reason = "max_steps"
        elif tc.max_epochs and state.epoch >= tc.max_epochs:
            reason = "max_epochs"
        elif time.perf_counter() - started >= budget:
            reason = "max_minutes"
        if runtime.world_size > 1:  # clocks differ between processes: the first rank to stop decides
            code = torch.tensor([reasons.index(reason)], device=runtime.device)
            dist.all_reduce(code, op=dist.ReduceOp.MAX)
            reason = reasons[int(code.item())]
        return reason

    def save(name: str) -> None:
        state.train_seconds = time.perf_counter() - started
        if runtime.is_main:
            state_dict = checkpoint_state(model, optimizer, scaler, config, tokenizer, state, ema)
            save_checkpoint(state_dict, run_dir / name)

    stop_reason = stop_reason_now()
    while stop_reason is None:
        batches = make_batches(
            src_lengths, tgt_lengths, config.data.max_tokens, True, tc.seed, state.epoch,
            runtime.rank, runtime.world_size, indices=splits.train_indices,
        )  # fmt: skip
        for batch in iter_batches(*splits.train, batches[state.batch_in_epoch :], *ids):
            train_model.train()
            batch = batch.to(runtime.device)
            with runtime.autocast():
                logits = train_model(batch.src, batch.tgt_in)  # (B, T, V)
            loss_sum = token_loss(logits, batch.tgt_out, tokenizer.pad_id, tc.label_smoothing)
            loss = loss_sum / batch.n_tgt_tokens  # per target token (§5.4 label smoothing inside)
            scaler.scale(loss / tc.accum_steps).backward()
            state.batch_in_epoch += 1
            state.train_tokens += batch.n_tgt_tokens
            window_tokens += batch.n_tgt_tokens
            micro += 1
            if micro % tc.accum_steps:
                continue
            scaler.unscale_(optimizer)
            max_norm = tc.clip_grad_norm if tc.clip_grad_norm > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            # in fp16 an overflowing gradient is routine: the scaler skips that update and lowers its scale
            grads_ok = scaler.is_enabled() or torch.isfinite(grad_norm)
            if not (torch.isfinite(loss) and grads_ok):
                optimizer.zero_grad(set_to_none=True)
                if tc.nonfinite_loss == "stop":
                    last = run_dir / "last.pt"
                    kept = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint yet"
                    raise TrainingError(
                        f"non-finite loss ({loss.item()}) or gradient norm at step {state.step + 1}; "
                        f"stopped: {kept}"
                    )
                print(f"skipping step {state.step + 1}: non-finite loss or gradient", file=sys.stderr)
                scaler.update()
                continue
            lr = learning_rate(state.step + 1, config.model.d_model, tc.warmup_steps, scale)
            set_lr(optimizer, lr)
            loss_scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if scaler.get_scale() < loss_scale:  # fp16 overflow: the scaler skipped this update
                continue
            state.step += 1
            if ema is not None:
                ema.update(unwrap(model))
            progress.update(1)
            if state.step % tc.log_every == 0 and runtime.is_main:
                tokens_per_s = window_tokens * runtime.world_size / (time.perf_counter() - window_start)
                window_tokens, window_start = 0, time.perf_counter()
                progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}")
                for tag, value in (("loss", loss.item()), ("lr", lr), ("tokens_per_s", tokens_per_s)):
                    writer.add_scalar(f"train/{tag}", value, state.step)
                writer.add_scalar("train/grad_norm", grad_norm.item(), state.step)
            if tc.checkpoint_every and state.step % tc.checkpoint_every == 0:
                save("last.pt")
            if config.eval.every_steps and state.step % config.eval.every_steps == 0:
                evaluate_and_save(model, splits, tokenizer, config, runtime, writer, state, save, ema)
            if (stop_reason := stop_reason_now()) is not None:
                break
        else:
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            stop_reason = stop_reason_now()
    progress.close()

    if not state.history or state.history[-1]["step"] != state.step:
        evaluate_and_save(model, splits, tokenizer, config, runtime, writer, state, save, ema)
    else:
        save("last.pt")
    results = None
    if runtime.is_main:
        results = final_test(run_dir, splits, tokenizer, config, runtime, state, stop_reason, n_params)
        writer.add_scalar("test/bleu", results["test_bleu"], state.step)
        hparams = {
            f"{section}.{k}": v for section, values in config.to_dict().items() for k, v in values.items()
        }
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
        metrics = {"hparam/test_bleu": results["test_bleu"], "hparam/best_val_bleu": results["best_val_bleu"]}
        writer.add_hparams(hparams, metrics, run_name="hparams")
        writer.close()
    if runtime.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return results


def evaluate_and_save(model, splits, tokenizer, config, runtime, writer, state: State, save, ema) -> None:
    if runtime.is_main:
        t0 = time.perf_counter()
        with ema.applied(unwrap(model)) if ema is not None else contextlib.nullcontext():
            entry = validate(model, splits, tokenizer, config, runtime, writer, state)
        print(
            f"step {entry['step']} epoch {entry['epoch']}: val loss {entry['val_loss']:.3f} "
            f"ppl {entry['val_ppl']:.2f} BLEU {entry['val_bleu']:.2f} chrF {entry['val_chrf']:.2f} "
            f"({time.perf_counter() - t0:.1f}s)",
            flush=True,
        )
        if entry["val_bleu"] > state.best_bleu:
            state.best_bleu = entry["val_bleu"]
            save("best.pt")
    save("last.pt")


def final_test(run_dir, splits, tokenizer, config, runtime, state: State, stop_reason, n_params) -> dict:
    """Decode the test set with the best checkpoint; write and return results.json."""
    best = load_checkpoint(run_dir / "best.pt", map_location=runtime.device)
    model = Transformer(config.model, tokenizer.vocab_size, tokenizer.vocab_size, tokenizer.pad_id)
    model.load_state_dict(best["model"])
    model.to(runtime.device)
    t0 = time.perf_counter()
    hyp_ids = translate_ids(
        model, splits.test[0], tokenizer, runtime.device, runtime.autocast, config.eval.max_tokens,
        config.eval.beam_size, config.eval.length_penalty, config.eval.max_len_offset, progress="test",
    )  # fmt: skip
    hyps = tokenizer.decode_batch(hyp_ids)
    (run_dir / "test_hypotheses.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    scores = bleu_chrf(hyps, splits.test_refs)
    results = {
        "test_bleu": scores["bleu"],
        "test_chrf": scores["chrf"],
        "signature": scores["signature"],
        "decoding": "greedy" if config.eval.beam_size == 1 else f"beam {config.eval.beam_size}",
        "best_val_bleu": state.best_bleu,
        "best_step": best["state"]["step"],
        "steps": state.step,
        "epochs_completed": state.epoch,
        "batches_into_last_epoch": state.batch_in_epoch,
        "stopped_by": stop_reason,
        "train_minutes": state.train_seconds / 60.0,
        "train_tokens": state.train_tokens,
        "train_tokens_per_s": state.train_tokens * runtime.world_size / max(state.train_seconds, 1e-9),
        "test_decode_seconds": time.perf_counter() - t0,
        "parameters": n_params,
        "device": str(runtime.device),
        "validation": state.history,
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    print(
        f"test BLEU {results['test_bleu']:.2f} chrF {results['test_chrf']:.2f} ({results['decoding']}, "
        f"best step {results['best_step']})\n{results['signature']}",
        flush=True,
    )
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        overrides = list(args.set) + ([f"data.data_dir={args.data_dir}"] if args.data_dir else [])
        config = load_config(args.config, overrides)
        run_dir = Path(args.run_dir or Path("runs") / Path(args.config).stem)
        if args.resume and not (run_dir / "last.pt").is_file():
            raise TrainingError(f"--resume: no checkpoint {run_dir / 'last.pt'} to resume from")
        train(config, run_dir, resume=args.resume)
    except (ConfigError, DataError, CheckpointError, TrainingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
