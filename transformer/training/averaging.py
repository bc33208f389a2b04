"""Checkpoint averaging (§6.1: "we used a single model obtained by averaging the last 5 checkpoints").

    python -m transformer.training.averaging OUT.pt CKPT.pt [CKPT.pt ...] [--weights raw|ema]
    python -m transformer.training.averaging OUT.pt --last N RUN_DIR    # the last N step_<S>.pt
    (train.keep_last)

``--weights raw`` (the default) averages the raw training weights, as §6.1 does; ``ema`` averages the
moving-average snapshots (train.ema_decay) that the checkpoints translate with. Without a moving average the
two are the same weights. Every floating-point tensor is averaged in float64 and stored in its own dtype; the
checkpoints must share their model config and tokenizer. The output is an inference checkpoint (config,
model, tokenizer) that ``translate.py`` loads like ``best.pt``.
"""

import argparse
import re
import sys
from pathlib import Path

import torch

from transformer.core.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def step_checkpoints(run_dir: Path) -> list[Path]:
    """RUN_DIR/step_<S>.pt, in the order of S."""
    found = [
        (int(m.group(1)), p)
        for p in Path(run_dir).glob("step_*.pt")
        if (m := re.fullmatch(r"step_(\d+)\.pt", p.name))
    ]
    return [path for _, path in sorted(found)]


def last_step_checkpoints(run_dir: Path, n: int) -> list[Path]:
    """The last ``n`` step_<S>.pt of a run; a CheckpointError when there are fewer."""
    found = step_checkpoints(run_dir)
    if len(found) < n:
        raise CheckpointError(
            f"{run_dir} holds {len(found)} step_<S>.pt checkpoints, not {n} (train.keep_last)"
        )
    return found[len(found) - n :]


def checkpoint_weights(checkpoint: dict, path: Path, weights: str) -> dict:
    """The ``raw`` (training) or ``ema`` (moving average) weights of a checkpoint, or a CheckpointError."""
    has_both = "train_model" in checkpoint  # the raw weights, and "model" the moving average
    # the older format kept only the moving average, as "model"
    only_ema = not has_both and checkpoint["config"].get("train", {}).get("ema_decay", 0.0) > 0
    if weights == "raw":
        if only_ema:
            raise CheckpointError(f"{path} holds only the moving average, not the raw weights (older format)")
        return checkpoint["train_model"] if has_both else checkpoint["model"]
    if weights != "ema":
        raise CheckpointError(f"weights must be raw or ema, got {weights!r}")
    if not (has_both or only_ema):
        raise CheckpointError(f"{path} has no moving average (train.ema_decay = 0): average --weights raw")
    return checkpoint["model"]


def average_checkpoints(paths: list[Path], weights: str = "raw", older_as_ema: bool = False) -> dict:
    """The inference checkpoint whose weights are the mean of the ``weights`` ("raw" / "ema") of ``paths``
    (each loaded once). ``older_as_ema``: raw weights asked of checkpoints whose first kept only the moving
    average (the older format) average the moving averages; its state's "averaged_weights" says which."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    if older_as_ema and weights == "raw" and "train_model" not in first:
        weights = "ema"
    first["model"] = checkpoint_weights(first, paths[0], weights)
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path in paths[1:]:
        other = load_checkpoint(path)
        other["model"] = checkpoint_weights(other, path, weights)
        if other["config"]["model"] != first["config"]["model"] or not torch.equal(
            other["tokenizer"], first["tokenizer"]
        ):
            raise CheckpointError(
                f"{path} has another model config or tokenizer than {paths[0]}; cannot average"
            )
        if other["model"].keys() != total.keys():
            raise CheckpointError(f"{path} holds other weights than {paths[0]}; cannot average")
        for key, value in other["model"].items():
            if value.is_floating_point():
                total[key] += value.double()
    model = {
        k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v
        for k, v in total.items()
    }
    state = dict(first.get("state", {}))
    state["averaged_from"], state["averaged_weights"] = [str(p) for p in paths], weights
    return {"config": first["config"], "model": model, "tokenizer": first["tokenizer"], "state": state}


def average_last(run_dir: Path, n: int, weights: str, has_ema: bool) -> Path:
    """RUN_DIR/averaged.pt, written: the average of the ``weights`` ("raw" / "ema") of the run's last ``n``
    step checkpoints (a run's final test with ``eval.average_last``). A run with a moving average
    (``has_ema``) whose older checkpoints kept only that average averages the moving averages, and says so."""
    averaged = average_checkpoints(last_step_checkpoints(run_dir, n), weights, older_as_ema=has_ema)
    if averaged["state"]["averaged_weights"] != weights:
        print("warning: step checkpoints from before the raw weights were kept: averaging their moving "
              "averages (eval.average_weights=ema)", file=sys.stderr)  # fmt: skip
    path = Path(run_dir) / "averaged.pt"
    save_checkpoint(averaged, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the averaged checkpoint to write")
    parser.add_argument("checkpoints", nargs="*", type=Path, help="checkpoints to average")
    parser.add_argument("--last", nargs=2, metavar=("N", "RUN_DIR"), help="the last N step_<S>.pt of RUN_DIR")
    parser.add_argument(
        "--weights", choices=("raw", "ema"), default="raw",
        help="average the raw training weights (§6.1, default) or the moving-average snapshots",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        paths = list(args.checkpoints)
        if args.last:
            paths += last_step_checkpoints(Path(args.last[1]), int(args.last[0]))
        save_checkpoint(average_checkpoints(paths, args.weights), args.output)
    except (CheckpointError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    names = ", ".join(p.name for p in paths)
    print(f"averaged the {args.weights} weights of {len(paths)} checkpoints into {args.output}: {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
