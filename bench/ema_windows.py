"""How far back the moving average of the weights should reach: train.py's run with more moving averages
kept beside the run's own, each then validated (greedy BLEU) at every evaluation step.

    python bench/ema_windows.py --config configs/multi30k_de_en.yaml --run-dir runs/ema_windows
    python bench/ema_windows.py --run-dir runs/ema_windows --validate-only   # the table of a finished run

Training is train.py's, unchanged: the same seed, batches and updates (each extra average costs one pass
over the weights per update, so a timed run makes a few fewer steps). The run's own average has the decay
min(train.ema_decay, (1 + n) / (10 + n)) after n updates (transformer/ema.py). The extra ones:
  - warm-up C (``--warmups``): decay (1 + n) / (C + n), no cap: it reaches back about n / (C − 1) updates;
  - D from the start (``--fixed``): decay D from the first update, bias-corrected as Adam's moments are
    (divided by 1 − Dⁿ): it reaches back about 1 / (1 − D) updates.
At every evaluation they are saved to RUN_DIR/ema_windows_<step>.pt; the table gives their validation BLEU
beside the run's own (results.json).
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # train.py, from anywhere
import train  # noqa: E402
import transformer.ema  # noqa: E402
from transformer.checkpoint import load_checkpoint, tokenizer_from_tensor  # noqa: E402
from transformer.config import config_from_dict  # noqa: E402
from transformer.model import build_model  # noqa: E402
from transformer.multi30k import load_multi30k  # noqa: E402
from transformer.translator import Translator  # noqa: E402


class Averages:
    """The extra moving averages, updated after the run's own at every update."""

    def __init__(self, warmups: list[float], fixed: list[float]):
        self.warmups, self.fixed, self.shadows = warmups, fixed, {}

    @torch.no_grad()
    def update(self, params: list[torch.Tensor], n: int) -> None:
        if not self.shadows:
            self.shadows = {f"warm-up {c:g}": [p.clone() for p in params] for c in self.warmups}
            zeros = {f"{d:g} from the start": [torch.zeros_like(p) for p in params] for d in self.fixed}
            self.shadows |= zeros
        for c in self.warmups:
            torch._foreach_lerp_(self.shadows[f"warm-up {c:g}"], params, 1.0 - (1 + n) / (c + n))
        for d in self.fixed:
            torch._foreach_lerp_(self.shadows[f"{d:g} from the start"], params, 1.0 - d)

    def averages(self, n: int) -> dict[str, list[torch.Tensor]]:
        """name -> the average's weights after n updates (the fixed decays bias-corrected)."""
        out = {f"warm-up {c:g}": self.shadows[f"warm-up {c:g}"] for c in self.warmups}
        for d in self.fixed:
            out[f"{d:g} from the start"] = [t / (1 - d**n) for t in self.shadows[f"{d:g} from the start"]]
        return {name: [t.clone() for t in ts] for name, ts in out.items()}


def train_with(averages: Averages, train_argv: list[str]) -> int:
    """train.main(train_argv) with ``averages`` updated after every update of the run's own and saved at
    every evaluation (train.py has no hooks: its EMA.update and evaluate_and_save are wrapped here)."""
    ema_update, evaluate_and_save = transformer.ema.EMA.update, train.evaluate_and_save

    def update(ema, model):
        ema_update(ema, model)
        averages.update([p.detach() for p in model.parameters()], ema.updates)

    def evaluate_and_save_all(run):
        result = evaluate_and_save(run)
        torch.save(averages.averages(run.ema.updates), run.run_dir / f"ema_windows_{run.state.step}.pt")
        return result

    transformer.ema.EMA.update, train.evaluate_and_save = update, evaluate_and_save_all
    try:
        return train.main(train_argv)
    finally:
        transformer.ema.EMA.update, train.evaluate_and_save = ema_update, evaluate_and_save


def validate_all(run_dir: Path, data_dir: str | None) -> None:
    """The markdown table: validation BLEU of every saved average at every evaluation step."""
    best = load_checkpoint(run_dir / "best.pt")
    config, tokenizer = config_from_dict(best["config"]), tokenizer_from_tensor(best["tokenizer"])
    validation = load_multi30k(config.data.src_lang, config.data.tgt_lang, data_dir)["validation"]
    src_ids = tokenizer.encode_batch(validation.src)
    own = {e["step"]: e["val_bleu"] for e in json.loads((run_dir / "results.json").read_text())["validation"]}
    model = build_model(config.model, tokenizer)
    translator = Translator(model, tokenizer, dataclasses.replace(config.eval, beam_size=1), "cpu", "fp32")
    steps = sorted(int(p.stem.rsplit("_", 1)[1]) for p in run_dir.glob("ema_windows_*.pt"))
    rows = {"the run's own (train.ema_decay)": [f"{own[s]:.2f}" for s in steps]}
    for step in steps:
        for name, weights in torch.load(run_dir / f"ema_windows_{step}.pt").items():
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in model.parameters()], weights)
            rows.setdefault(name, []).append(f"{translator.evaluate(src_ids, validation.tgt)[2]['bleu']:.2f}")
    print("| average | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("| --- |" + " --- |" * len(steps))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", default="configs/multi30k_de_en.yaml")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE, passed to train.py")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--warmups", type=float, nargs="*", default=[4.0, 6.0, 20.0])
    parser.add_argument("--fixed", type=float, nargs="*", default=[0.998])
    parser.add_argument("--validate-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.validate_only:
        train_argv = ["--config", args.config, "--run-dir", str(args.run_dir)]
        train_argv += [a for kv in args.set for a in ("--set", kv)]
        train_argv += ["--data-dir", args.data_dir] if args.data_dir else []
        if train_with(Averages(args.warmups, args.fixed), train_argv) != 0:
            return 1
    validate_all(args.run_dir, args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
