"""The prepared GPU run: one command of at most 10 minutes on one GPU, every figure into OUT/results.json.

    python3 bench/gpu.py OUT [--data-dir DIR] [--train-minutes 5] [--budget-s 570] [--checkpoint CKPT]
    python3 bench/gpu.py OUT --smoke          # the same stages on the CPU, tiny sizes, seconds each

Stages, in this order, each in its own process with its own time limit; a stage that fails or runs out of
time is recorded with its error and the next one runs, and OUT/results.json is rewritten after every stage:

  env         Python, torch, CUDA, the GPU, which packages are there
  throughput  training target tokens/s of our model vs the same model on nn.Transformer (bench/
              train_throughput.py), base sizes, bf16, real Multi30k batches of base.yaml's and the GPU
              config's size; MFU against 989 TFLOP/s (dense bf16, H100/H200 SXM)
  train       train.py on configs/multi30k_de_en_gpu.yaml for train.max_minutes: test BLEU (greedy) with
              the sacreBLEU signature; the TensorBoard events are copied to OUT/tensorboard/
  decode      greedy (cached / uncached) and beam 4 on test_2016_flickr with train's best.pt (or
              --checkpoint): sentences/s and BLEU (bench/decode_speed.py), bf16 autocast
  compile     throughput again with our model under torch.compile(dynamic=True), as train.compile does

Data: --data-dir, else $MULTI30K_DIR, else the checkout's data/multi30k (git-ignored; see data/README.md).
Nothing else is needed: no network, no ``datasets``.
"""

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_CONFIG = ROOT / "configs/multi30k_de_en_gpu.yaml"
BASE_CONFIG = ROOT / "configs/base.yaml"
PEAK_TFLOPS = 989.0  # dense bf16 of an H100 / H200 SXM
MIN_STAGE_S = 20.0  # a stage with less time than this left in the budget is skipped
SMOKE_MODEL = [
    "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
]  # fmt: skip
SMOKE_TRAIN = SMOKE_MODEL + [
    "data.vocab_size=300", "data.max_tokens=600", "data.train_limit=400", "data.eval_limit=16",
    "train.device=cpu", "train.precision=fp32", "train.max_steps=12", "train.warmup_steps=4",
    "train.log_every=2", "eval.every_steps=6", "eval.max_tokens=2000", "eval.n_alignment_sentences=1",
    "eval.n_sample_translations=2", "eval.max_len_offset=10",
]  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """What the stages do: the GPU run, or the same code on the CPU with tiny sizes (``--smoke``)."""

    device: str
    precision: str  # of the throughput stages: "bf16" (GPU) or "fp32" (smoke: CPU bf16 is slow)
    data_dir: str | None
    model_overrides: list[str]  # on base.yaml's model, for the throughput stages
    throughput_tokens: list[int]  # batch sizes (padded tokens) to measure
    throughput_steps: int
    vocab_size: int
    train_overrides: list[str]  # on configs/multi30k_de_en_gpu.yaml
    checkpoint: str | None  # for decode; None: train's best.pt
    decode_limit: int  # 0: the whole test set
    compile_backend: str
    timeouts: dict[str, float]  # seconds per stage, before the overall budget cuts them


def make_plan(args: argparse.Namespace) -> Plan:
    minutes = [f"train.max_minutes={args.train_minutes}"]
    if args.smoke:
        return Plan(
            "cpu", "fp32", args.data_dir, SMOKE_MODEL, [600], 2, 300, SMOKE_TRAIN + minutes,
            args.checkpoint, 8, "aot_eager", dict.fromkeys(STAGES, 240.0),
        )  # fmt: skip
    from transformer.config import load_config

    sizes = [load_config(BASE_CONFIG).data.max_tokens, load_config(GPU_CONFIG).data.max_tokens]
    timeouts = {"env": 60, "throughput": 180, "train": args.train_minutes * 60 + 150, "decode": 150}
    return Plan(
        "cuda", "bf16", args.data_dir, [], sizes, 20, 8000, minutes, args.checkpoint, 0, "inductor",
        timeouts | {"compile": 300},
    )  # fmt: skip


# -------- stages: each returns its figures; ``save`` records the figures so far (a stage cut off keeps them)


def stage_env(plan: Plan, work: Path, out: Path, save: Callable[[dict], None]) -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
        "device": plan.device,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
        }
    for name in ("sentencepiece", "sacrebleu", "tensorboard", "datasets"):
        found = importlib.util.find_spec(name) is not None
        info[f"{name}_version"] = importlib.metadata.version(name) if found else None
    print(", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    return info


def stage_throughput(plan: Plan, work: Path, out: Path, save: Callable[[dict], None], compiled=False) -> dict:
    import torch
    import train_throughput

    from transformer.config import load_config

    sizes = load_config(BASE_CONFIG, plan.model_overrides).model
    backend = plan.compile_backend if compiled else None
    dtype = {"bf16": torch.bfloat16, "fp32": None}[plan.precision]
    result = {"precision": plan.precision, "peak_tflops": PEAK_TFLOPS, "compile": backend, "runs": []}
    result["model"] = {k: getattr(sizes, k) for k in ("d_model", "n_heads", "d_ff", "n_encoder_layers")}
    for max_tokens in plan.throughput_tokens:
        batches, vocab = train_throughput.real_batches(
            plan.data_dir, max_tokens, plan.throughput_steps, plan.vocab_size
        )
        measured = train_throughput.measure(
            sizes, batches, vocab, plan.throughput_steps, plan.device, dtype, backend
        )
        (ours, ours_flops), (theirs, theirs_flops) = measured["ours"], measured["torch"]
        run = {
            "max_tokens": max_tokens,
            "batches": len(batches),
            "ours_tgt_tokens_per_s": ours,
            "torch_tgt_tokens_per_s": theirs,
            "ratio_vs_torch": ours / theirs,
            "ours_tflops": ours_flops / 1e12,
            "torch_tflops": theirs_flops / 1e12,
            "ours_mfu": ours_flops / (PEAK_TFLOPS * 1e12),
            "torch_mfu": theirs_flops / (PEAK_TFLOPS * 1e12),
        }
        result["runs"].append(run)
        save(result)
        print(
            f"{max_tokens} tokens{' compiled' if backend else ''}: ours {ours:.0f} tgt tok/s, torch "
            f"{theirs:.0f}, ratio {ours / theirs:.3f}, "
            f"MFU ours {run['ours_mfu']:.1%} torch {run['torch_mfu']:.1%}",
            flush=True,
        )
    return result


def stage_compile(plan: Plan, work: Path, out: Path, save: Callable[[dict], None]) -> dict:
    return stage_throughput(plan, work, out, save, compiled=True)


def stage_train(plan: Plan, work: Path, out: Path, save: Callable[[dict], None]) -> dict:
    import train

    run_dir = work / "run"
    argv = ["--config", str(GPU_CONFIG), "--run-dir", str(run_dir)] + [
        f"--set={o}" for o in plan.train_overrides
    ]
    argv += ["--data-dir", plan.data_dir] if plan.data_dir else []
    code = train.main(argv)
    if code != 0:
        raise RuntimeError(f"train.py exited with {code} (its error is in the log above)")
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    keep = (
        "test_bleu", "test_chrf", "signature", "decoding", "steps", "epochs_completed", "stopped_by",
        "train_minutes", "train_tokens_per_s", "best_step", "best_val_bleu", "parameters", "device",
    )  # fmt: skip
    history = [{k: e.get(k) for k in ("step", "val_bleu", "val_loss")} for e in results.get("validation", [])]
    return {k: results.get(k) for k in keep} | {"validation": history, "checkpoint": str(run_dir / "best.pt")}


def stage_decode(plan: Plan, work: Path, out: Path, save: Callable[[dict], None]) -> dict:
    import decode_speed
    import torch

    from transformer.checkpoint import load_for_inference
    from transformer.multi30k import load_multi30k
    from transformer.runtime import autocast_dtype

    checkpoint = Path(plan.checkpoint) if plan.checkpoint else work / "run" / "best.pt"
    model, tokenizer, config = load_for_inference(checkpoint, plan.device)
    data = config.data
    test = load_multi30k(data.src_lang, data.tgt_lang, plan.data_dir)["test"].head(plan.decode_limit)
    dtype = autocast_dtype(config.train.precision, torch.device(plan.device))
    autocast = (lambda: torch.autocast(plan.device, dtype=dtype)) if dtype else contextlib.nullcontext
    beam = 4
    settings = config.eval
    print(f"decoding {len(test)} sentences with {checkpoint} on {plan.device} ({dtype})", flush=True)
    result = decode_speed.measure_decoding(model, tokenizer, settings, test, plan.device, beam, autocast)
    info = {
        "checkpoint": str(checkpoint),
        "sentences": len(test),
        "beam": beam,
        "precision": str(dtype or "fp32"),
    }
    return info | {"max_tokens": settings.max_tokens, "length_penalty": settings.length_penalty} | result


STAGE_FUNCTIONS = {
    "env": stage_env,
    "throughput": stage_throughput,
    "train": stage_train,
    "decode": stage_decode,
    "compile": stage_compile,
}
STAGES = tuple(STAGE_FUNCTIONS)


# -------- running the stages ---------------------------------------------------------------------------


def run_stage_here(name: str, plan: Plan, work: Path, out: Path) -> int:
    """In the stage's own process: run it, write WORK/<name>.json (figures, or the error)."""
    path = work / f"{name}.json"

    def save(figures: dict) -> None:
        path.write_text(json.dumps(figures, indent=1), encoding="utf-8")

    try:
        save(STAGE_FUNCTIONS[name](plan, work, out, save))
        return 0
    except Exception as error:
        traceback.print_exc()
        partial = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        save(partial | {"error": f"{type(error).__name__}: {message}"})
        return 1


def run_stage(name: str, argv: list[str], work: Path, seconds: float) -> dict:
    """Run one stage in a child process (its own process group) for at most ``seconds``; its figures."""
    path = work / f"{name}.json"
    start = time.monotonic()
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--stage", name, "--work", str(work)]
    child = subprocess.Popen(command, preexec_fn=os.setpgrp)
    try:
        code, timed_out = child.wait(timeout=seconds), False
    except subprocess.TimeoutExpired:
        code, timed_out = None, True
    finally:
        if child.poll() is None:  # timed out, or this process was interrupted: the stage ends too
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    figures = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if timed_out:
        figures["error"] = f"timed out after {seconds:.0f} s"
    elif code != 0 and "error" not in figures:
        figures["error"] = f"exit code {code}"
    return figures | {"seconds": round(time.monotonic() - start, 1)}


def copy_events(run_dir: Path, out: Path) -> list[str]:
    """The run's TensorBoard event files (and its hparams run) into OUT/tensorboard, nothing else: the
    checkpoints stay behind (a file that comes back from the GPU machine must be small)."""
    copied = []
    for events in sorted(run_dir.glob("events.out.tfevents.*")) + sorted(
        run_dir.glob("*/events.out.tfevents.*")
    ):
        target = out / "tensorboard" / events.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(events, target)
        copied.append(str(target.relative_to(out)))
    return copied


def summary(stages: dict[str, dict]) -> dict:
    """The headline figures, for the docs: one flat dict (None where a stage gave none)."""
    env, train, decode = stages.get("env", {}), stages.get("train", {}), stages.get("decode", {})
    figures = {"gpu": env.get("gpu"), "torch": env.get("torch")}
    for stage in ("throughput", "compile"):
        for run in stages.get(stage, {}).get("runs", []):
            key = f"{stage}_{run['max_tokens']}"
            figures |= {
                f"{key}_ours_tok_s": round(run["ours_tgt_tokens_per_s"]),
                f"{key}_torch_tok_s": round(run["torch_tgt_tokens_per_s"]),
                f"{key}_ratio": round(run["ratio_vs_torch"], 3),
                f"{key}_ours_mfu": round(run["ours_mfu"], 4),
            }
    figures |= {
        "train_steps": train.get("steps"),
        "train_minutes": train.get("train_minutes"),
        "test_bleu_greedy": train.get("test_bleu"),
        "test_bleu_beam4": decode.get("beam4_cache", {}).get("bleu"),
        "signature": train.get("signature") or decode.get("signature"),
    }
    for method in ("greedy_cache", "greedy_no_cache", "beam4_cache"):
        figures[f"decode_{method}_sent_s"] = decode.get(method, {}).get("sentences_per_s")
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder for results.json and tensorboard/")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, seconds per stage")
    parser.add_argument("--data-dir", help="Multi30k folder (default: $MULTI30K_DIR, else data/multi30k)")
    parser.add_argument(
        "--train-minutes", type=float, default=5.0, help="train stage budget (train.max_minutes)"
    )
    parser.add_argument("--budget-s", type=float, help="the whole run's limit (default 570 s; smoke 900 s)")
    parser.add_argument("--checkpoint", help="decode this checkpoint instead of the train stage's best.pt")
    parser.add_argument(
        "--stages", nargs="+", choices=STAGES, default=list(STAGES), help="a subset, in order"
    )
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # inside a stage's own process
    parser.add_argument("--work", help=argparse.SUPPRESS)  # scratch folder shared by the stages
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # run from anywhere, no install
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = make_plan(args)
    if args.stage:
        return run_stage_here(args.stage, plan, Path(args.work), out)
    budget = args.budget_s or (900.0 if args.smoke else 570.0)
    deadline = time.monotonic() + budget
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_bench_"))
    results = {
        "smoke": args.smoke,
        "budget_s": budget,
        "work": str(work),
        "started": time.ctime(),
        "stages": {},
    }
    for name in args.stages:
        seconds = min(plan.timeouts[name], deadline - time.monotonic())
        print(f"=== {name} (at most {seconds:.0f} s)", flush=True)
        if seconds < MIN_STAGE_S:
            figures = {"error": f"skipped: {max(seconds, 0):.0f} s left of the {budget:.0f} s budget"}
        else:
            figures = run_stage(name, argv, work, seconds)
        if name == "train":
            figures["tensorboard"] = copy_events(work / "run", out)
        results["stages"][name] = figures
        results["summary"] = summary(results["stages"])
        (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        print(f"=== {name}: {figures.get('error', 'ok')} ({figures.get('seconds', 0)} s)", flush=True)
    print(json.dumps(results["summary"], indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)  # checkpoints of the train stage: too big to bring back
    failed = [name for name, figures in results["stages"].items() if "error" in figures]
    print(f"results: {out / 'results.json'}; failed stages: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
