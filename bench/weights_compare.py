"""Which weights of a finished run translate best: best.pt, the last step's raw weights, the moving average
(train.ema_decay), and the average of the kept evaluation checkpoints (train.keep_last, §6.1): of their raw
weights and of their moving averages.

    python bench/weights_compare.py RUN_DIR [--data-dir DIR]

Greedy BLEU on the validation set (to choose by) and on test_2016_flickr (to report), each with the run's
own tokenizer and eval settings. Prints a markdown table.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

from transformer.average import average_checkpoints, step_checkpoints
from transformer.checkpoint import load_checkpoint, tokenizer_from_tensor
from transformer.config import config_from_dict
from transformer.model import build_model
from transformer.multi30k import load_multi30k
from transformer.translator import Translator


def candidates(run_dir: Path) -> dict[str, dict]:
    """name -> a model state dict: best.pt, the last step's raw weights and moving average, and the
    average of the kept evaluation checkpoints' raw weights (§6.1) and of their moving averages."""
    last = load_checkpoint(run_dir / "last.pt")
    found = {"best.pt": load_checkpoint(run_dir / "best.pt")["model"]}
    has_ema = "train_model" in last
    found["last step, raw weights"] = last["train_model"] if has_ema else last["model"]
    if has_ema:
        found["last step, moving average"] = last["model"]
    kept = step_checkpoints(run_dir)
    if len(kept) > 1:
        for weights in ("raw", "ema") if has_ema else ("raw",):
            what = "raw weights" if weights == "raw" else "moving averages"
            name = f"average of the last {len(kept)} evaluation checkpoints' {what}"
            found[name] = average_checkpoints(kept, weights)["model"]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    best = load_checkpoint(args.run_dir / "best.pt")
    config, tokenizer = config_from_dict(best["config"]), tokenizer_from_tensor(best["tokenizer"])
    corpus = load_multi30k(config.data.src_lang, config.data.tgt_lang, args.data_dir)
    greedy = dataclasses.replace(config.eval, beam_size=1)
    print("| weights | validation BLEU | test BLEU |\n| --- | --- | --- |")
    for name, state in candidates(args.run_dir).items():
        model = build_model(config.model, tokenizer)
        model.load_state_dict(state)
        scores, translator = [], Translator(model, tokenizer, greedy, "cpu", "fp32")
        for split in ("validation", "test"):
            src_ids = tokenizer.encode_batch(corpus[split].src)
            _, _, score = translator.evaluate(src_ids, corpus[split].tgt)
            scores.append(score["bleu"])
        print(f"| {name} | {scores[0]:.2f} | {scores[1]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
