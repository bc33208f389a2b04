"""Rank recipe changes of the main job on the VALIDATION set, one short run each (the same number of steps,
so that the machine's speed that day does not decide), one after another.

    python bench/ablation.py --steps 800 \
        baseline= ema=train.ema_decay=0.998 vocab6k=data.vocab_size=6000

Each NAME=OVERRIDE[,OVERRIDE...] trains configs/multi30k_de_en.yaml with those --set overrides into
runs/ablation/NAME (skipped when its results.json is there) and the table of validation BLEU / loss and
steps per second is printed at the end, as markdown. Test BLEU is printed too, but choose on validation.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(name: str, overrides: list[str], args: argparse.Namespace) -> dict:
    run_dir = ROOT / "runs" / "ablation" / name
    if not (run_dir / "results.json").is_file():
        command = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / args.config),
                   "--run-dir", str(run_dir), "--overwrite", "--set", f"train.max_steps={args.steps}",
                   "--set", "train.max_minutes=0", "--set", "eval.every_steps=0"]  # fmt: skip
        command += ["--data-dir", args.data_dir] if args.data_dir else []
        for override in overrides:
            command += ["--set", override]
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((run_dir / "results.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", metavar="NAME=OVERRIDE[,OVERRIDE...]")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--config", default="configs/multi30k_de_en.yaml")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    rows = [
        "| variant | overrides | val BLEU | val loss | test BLEU | steps/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for variant in args.variants:
        name, _, spec = variant.partition("=")
        overrides = [o for o in spec.split(",") if o]
        results = run(name, overrides, args)
        last = results["validation"][-1]
        speed = results["steps"] / (60 * results["train_minutes"])
        rows.append(f"| {name} | {' '.join(overrides) or '(none)'} | {last['val_bleu']:.2f} | "
                    f"{last['val_loss']:.3f} | {results['test_bleu']:.2f} | {speed:.2f} |")  # fmt: skip
        print(rows[-1], flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
