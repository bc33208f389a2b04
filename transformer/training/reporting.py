"""What a training run reports: TensorBoard scalars, texts, heatmaps and hyperparameters (tags by split:
``train/``, ``val/``, ``test/``), and its one-line console summaries. ``train.py`` owns the writer.
"""

from pathlib import Path

import torch
import yaml

from transformer.runtime.configs import Config


def open_writer(run_dir: Path, config: Config):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))
    writer.add_text("config", "```\n" + yaml.safe_dump(config.to_dict(), sort_keys=False) + "\n```", 0)
    return writer


def setup_line(model, runtime, n_train_pairs: int, vocab_size: int) -> str:
    n_params = sum(p.numel() for p in model.parameters())
    return (
        f"{n_params / 1e6:.2f}M parameters on {runtime.device} ({runtime.precision}), "
        f"{n_train_pairs} training pairs, vocabulary {vocab_size}"
    )


def log_train_step(
    writer, progress, step: int, loss: torch.Tensor, lr: float, grad_norm, tokens_per_s: float
):
    progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}")
    for tag, value in (("loss", loss.item()), ("lr", lr), ("tokens_per_s", tokens_per_s)):
        writer.add_scalar(f"train/{tag}", value, step)
    writer.add_scalar("train/grad_norm", grad_norm.item(), step)


def log_validation(writer, entry: dict, samples: list[tuple[str, str, str]], attentions: dict) -> None:
    """The validation scalars, sample translations (source, reference, hypothesis) and attention heatmaps
    (``attentions``: TensorBoard tag -> ``translator.SentenceAttention``)."""
    from transformer.runtime.plotting import add_attention_figures  # matplotlib loads when a figure is drawn

    step = entry["step"]
    for key in ("loss", "ppl", "bleu", "chrf"):
        writer.add_scalar(f"val/{key}", entry[f"val_{key}"], step)
    for name, scores in entry.get("val_corpora", {}).items():  # several corpora: each one's
        for key in ("bleu", "chrf"):
            writer.add_scalar(f"val/{name}/{key}", scores[key], step)
    texts = [f"**src** {src}  \n**ref** {ref}  \n**hyp** {hyp}" for src, ref, hyp in samples]
    writer.add_text("val/translations", "\n\n".join(texts), step)
    kinds = ("cross", "encoder_self", "decoder_self")
    for tag, attention in attentions.items():
        add_attention_figures(writer, tag, attention.batched(), attention.labels, step, kinds)


def validation_line(entry: dict, seconds: float) -> str:
    corpora = entry.get("val_corpora", {})
    each = " (" + ", ".join(f"{name} {scores['bleu']:.2f}" for name, scores in corpora.items()) + ")"
    return (
        f"step {entry['step']} epoch {entry['epoch']}: val loss {entry['val_loss']:.3f} "
        f"ppl {entry['val_ppl']:.2f} BLEU {entry['val_bleu']:.2f}{each if corpora else ''} "
        f"chrF {entry['val_chrf']:.2f} ({seconds:.1f}s)"
    )


def run_results(
    scores: dict, config: Config, state, stop_reason: str | None, world_size: int, **extra
) -> dict:
    """results.json: the test scores, how training went (``state``: train.py's State), ``extra`` facts."""
    return (
        {f"test_{k}" if k != "signature" else k: v for k, v in scores.items()}
        | {
            "decoding": "greedy" if config.eval.beam_size == 1 else f"beam {config.eval.beam_size}",
            "best_val_bleu": state.best_bleu,
            "best_step": state.best_step,
            "steps": state.step,
            "epochs_completed": state.epoch,
            "batches_into_last_epoch": state.batch_in_epoch,
            "stopped_by": stop_reason,
            "train_minutes": state.train_seconds / 60.0,
            "train_tokens": state.train_tokens,
            "train_tokens_per_s": state.train_tokens * world_size / max(state.train_seconds, 1e-9),
        }
        | extra
        | {"validation": state.history}
    )


def test_line(results: dict) -> str:
    return (
        f"test BLEU {results['test_bleu']:.2f} chrF {results['test_chrf']:.2f} ({results['decoding']}, "
        f"best step {results['best_step']})\n{results['signature']}"
    )


def log_test(writer, config: Config, results: dict, step: int) -> None:
    """The test BLEU, and the run's hyperparameters with its scores (TensorBoard's HPARAMS tab)."""
    writer.add_scalar("test/bleu", results["test_bleu"], step)
    for name, scores in results.get("test_corpora", {}).items():  # several corpora: each one's
        for key in ("bleu", "chrf"):
            writer.add_scalar(f"test/{name}/{key}", scores[key], step)
    hparams = {f"{section}.{k}": v for section, values in config.to_dict().items() for k, v in values.items()}
    hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
    metrics = {"hparam/test_bleu": results["test_bleu"], "hparam/best_val_bleu": results["best_val_bleu"]}
    writer.add_hparams(hparams, metrics, run_name="hparams")
