"""How training starts on millions of sentence pairs: time to the first training step, peak memory, disk.

    python bench/data_scale.py --sizes 500000 2000000 10000000 [--tree CHECKOUT] [--work /tmp/data_scale]

For each N, a synthetic parallel corpus of N pairs is made from the Multi30k training set (pair i is pair
i mod 29000 with the words of both sides shuffled by a generator seeded with i, so that lines stay unique),
with the Multi30k validation and test sets, as `data.dataset: text` files. Then, each in a fresh process of
``train.py``'s code (from ``--tree``, default this checkout), with ``data.cache_dir`` an empty folder:

  first   setup (tokenizer, token ids, batches, model) and one training step into a new run folder;
  second  the same into another run folder, the cache now filled (a checkout without a cache: tokenizes
          again).

Measured: seconds from the process's start to the end of its first optimizer step, the peak resident memory
of the largest process (``os.wait4``: the training process or one of its tokenizing workers), and the size
of everything in the cache folder. One line per (N, run), then a Markdown table.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAIN_CONFIG = "transformer/configs/multi30k_de_en.yaml"


def make_corpus(folder: Path, n_pairs: int, data_dir: Path) -> str:
    """<folder>/corpus.{train,valid,test}.{de,en}; returns the text prefix."""
    sys.path.insert(0, str(ROOT))
    from transformer.training.multi30k import load_multi30k

    prefix = folder / "corpus"
    if (folder / "done").exists():
        return str(prefix)
    folder.mkdir(parents=True, exist_ok=True)
    corpus = load_multi30k("de", "en", data_dir)
    train = corpus["train"]
    with open(f"{prefix}.train.de", "w", encoding="utf-8") as de, open(f"{prefix}.train.en", "w") as en:
        for i in range(n_pairs):
            rng = random.Random(i)
            src, tgt = train.src[i % len(train)].split(), train.tgt[i % len(train)].split()
            rng.shuffle(src)
            rng.shuffle(tgt)
            de.write(" ".join(src) + "\n")
            en.write(" ".join(tgt) + "\n")
    for split, stem in (("validation", "valid"), ("test", "test")):
        for side, lang in (("src", "de"), ("tgt", "en")):
            lines = getattr(corpus[split], side)
            Path(f"{prefix}.{stem}.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    (folder / "done").touch()
    return str(prefix)


def first_step(tree: Path, run_dir: Path, overrides: list[str]) -> None:
    """(In a child process) train.py's setup and one optimizer step, then print the seconds since start."""
    sys.path.insert(0, str(tree))
    from transformer.commands import train
    from transformer.runtime.configs import load_config
    from transformer.training.run import setup

    config = load_config(tree / MAIN_CONFIG, overrides)
    run = setup(config, run_dir, False, False)
    loss = train.accumulate_gradients(run, run.model, [next(train.epoch_batches(run))])
    train.optimizer_step(run, loss)
    print(json.dumps({"done": True}), flush=True)


def measure(tree: Path, run_dir: Path, overrides: list[str]) -> dict:
    """Run ``first_step`` in a fresh process: its wall time and the peak RSS of its largest process."""
    command = [sys.executable, __file__, "--child", str(tree), str(run_dir), *overrides]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=tree)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0 or '"done": true' not in out:
        raise SystemExit(f"error: the run into {run_dir} failed (status {status})")
    return {"seconds": seconds, "peak_rss_gb": usage.ru_maxrss / 1024**2}  # ru_maxrss in KiB


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500_000, 2_000_000, 10_000_000])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code runs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/data_scale"), help="corpora and runs")
    parser.add_argument("--data-dir", default=None, help="Multi30k (default: the project's rule)")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        first_step(Path(args.child[0]), Path(args.child[1]), args.child[2:])
        return 0
    sys.path.insert(0, str(ROOT))
    from transformer.training.multi30k import locate

    data_dir = locate(args.data_dir)[0]
    rows = []
    for n in args.sizes:
        prefix = make_corpus(args.work / f"corpus_{n}", n, data_dir)
        cache, runs = args.work / f"cache_{n}", args.work / f"runs_{n}"
        for folder in (cache, runs):
            shutil.rmtree(folder, ignore_errors=True)
        overrides = ["data.dataset=text", f"data.text_prefix={prefix}", "train.max_minutes=0"]
        if "cache_dir" in (args.tree / "transformer" / "config.py").read_text():  # a checkout with a cache
            overrides.append(f"data.cache_dir={cache}")
        for run in ("first", "second"):
            row = {"pairs": n, "run": run} | measure(args.tree, runs / run, overrides)
            row["cache_mb"] = folder_size(cache) / 1e6 if cache.exists() else 0.0
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| pairs | run | first step (s) | peak RSS (GB) | cache on disk (MB) |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['pairs']:,} | {row['run']} | {row['seconds']:.1f} | {row['peak_rss_gb']:.2f} | "
              f"{row['cache_mb']:.0f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
