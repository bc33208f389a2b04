"""Which weights of a finished run translate best: best.pt, the last step's raw weights, the moving average
(train.ema_decay), and the average of the kept evaluation checkpoints (train.keep_last, §6.1).

    python bench/weights_compare.py RUN_DIR [--data-dir DIR]

Greedy BLEU on the validation set (to choose by) and on test_2016_flickr (to report), each with the run's
own tokenizer and eval settings. Prints a markdown table.
"""

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install
from transformer.average import average_checkpoints, step_checkpoints  # noqa: E402
from transformer.checkpoint import build_model, load_checkpoint, tokenizer_from_tensor  # noqa: E402
from transformer.config import config_from_dict  # noqa: E402
from transformer.evaluation import translate_and_score  # noqa: E402
from transformer.multi30k import load_multi30k  # noqa: E402


def candidates(run_dir: Path) -> dict[str, dict]:
    """name -> a model state dict."""
    last = load_checkpoint(run_dir / "last.pt")
    found = {"best.pt": load_checkpoint(run_dir / "best.pt")["model"]}
    if "train_model" in last:
        found["last step, raw weights"] = last["train_model"]
        found["last step, moving average"] = last["model"]
    else:
        found["last step"] = last["model"]
    kept = step_checkpoints(run_dir)
    if len(kept) > 1:
        found[f"average of the last {len(kept)} evaluations"] = average_checkpoints(kept)["model"]
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
        scores = []
        for split in ("validation", "test"):
            src_ids = tokenizer.encode_batch(corpus[split].src)
            with torch.no_grad():
                _, _, score = translate_and_score(
                    model, src_ids, corpus[split].tgt, tokenizer, "cpu", contextlib.nullcontext, greedy
                )
            scores.append(score["bleu"])
        print(f"| {name} | {scores[0]:.2f} | {scores[1]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
