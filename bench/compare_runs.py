"""Are two training runs the same? Validation history (results.json) and final weights (last.pt), bit for bit.

    python bench/compare_runs.py RUN_A RUN_B      # exit status 0 when identical

Used to show that a refactor changed nothing: the same config, seed and data before and after give the same
run (on the CPU, training is deterministic for a seed). Wall-clock figures (minutes, tokens/s) are ignored.
"""

import json
import sys
from pathlib import Path

import torch

COMPARED = ("precision", "steps", "best_step", "best_val_bleu", "train_tokens", "test_bleu", "test_chrf")


def compare(a: Path, b: Path) -> bool:
    results_a, results_b = (json.loads((run / "results.json").read_text()) for run in (a, b))
    history = results_a["validation"] == results_b["validation"]
    figures = all(results_a[k] == results_b[k] for k in COMPARED)
    weights_a, weights_b = (torch.load(run / "last.pt", weights_only=True)["model"] for run in (a, b))
    weights = weights_a.keys() == weights_b.keys() and all(
        torch.equal(weights_a[k], weights_b[k]) for k in weights_a
    )
    n = len(results_a["validation"])
    print(f"{a} vs {b}: validation history identical: {history} ({n} evaluations); "
          f"{', '.join(COMPARED)} identical: {figures}; final weights bit-identical: {weights} "
          f"({len(weights_a)} tensors)")  # fmt: skip
    return history and figures and weights


if __name__ == "__main__":
    sys.exit(0 if compare(Path(sys.argv[1]), Path(sys.argv[2])) else 1)
