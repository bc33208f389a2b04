"""The prepared GPU run: one command of at most 10 minutes on one GPU, every figure into OUT/results.json.

    python3 bench/gpu.py OUT [--data-dir DIR] [--train-minutes 5] [--budget-s 570] [--checkpoint CKPT]
    python3 bench/gpu.py OUT --smoke          # the same stages on the CPU, tiny sizes, seconds each
                                              # (compile: the eager backend, the stage's code alone)

Stages, in this order, each in its own process with its own share of the budget (seconds at the default
570 s; a larger budget scales every share up); a stage that ends early leaves its unused time to the later
ones, and a stage that fails or runs out of time is recorded with its error and the next one runs:

  env         20 s   Python, torch, CUDA, the GPU, which packages are there
  throughput  60 s   training target tokens/s of our model vs the same model on nn.Transformer (bench/
                     train_throughput.py), base sizes, bf16, real Multi30k batches of base.yaml's and the
                     GPU config's size; MFU against 989 TFLOP/s (dense bf16, H100/H200 SXM)
  train      375 s   train.py on config multi30k_de_en_gpu for train.max_minutes (--train-minutes) plus
                     75 s of setup and test decoding: test BLEU (greedy) with the sacreBLEU signature; the
                     TensorBoard events (scalars and texts, no heatmaps, at most 8 MiB) go to OUT/tensorboard/
  decode      55 s   greedy (cached / uncached) and beam 4 on test_2016_flickr with train's best.pt (or
                     --checkpoint): sentences/s and BLEU (bench/decode_speed.py), bf16 autocast
  compile     60 s   throughput again with our model under torch.compile(dynamic=True), as train.compile does

A budget too small for --train-minutes shortens the training (and says so at the start); one too small for a
minute of training beside the other stages is an error. OUT/results.json is written atomically before each
stage (the stage marked unfinished: what a kill leaves) and after it; SIGTERM or Ctrl-C ends the running
stage, keeps its figures so far and starts no other.

Data: --data-dir, else $MULTI30K_DIR (bench/gpu.sh sets it to the checkout's data/multi30k when there is
a copy).
Nothing else is needed: no network, no ``datasets``.
"""

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_CONFIG = ROOT / "transformer/configs/multi30k_de_en_gpu.yaml"
BASE_CONFIG = ROOT / "transformer/configs/base.yaml"
PEAK_TFLOPS = 989.0  # dense bf16 of an H100 / H200 SXM
MIN_STAGE_S = 20.0  # a stage with less time than this left in the budget is skipped
# Each stage's share of the budget in seconds at the default 570 s; the train stage's is train.max_minutes
# plus TRAIN_SETUP_S. A larger budget scales every share up; they never add up to more than the budget.
SHARES = {"env": 20.0, "throughput": 60.0, "decode": 55.0, "compile": 60.0}
TRAIN_SETUP_S = 75.0  # beyond max_minutes: tokenizer, data, the last validation, test decoding, checkpoints
MIN_TRAIN_MINUTES = 1.0  # a budget that leaves less training than this is an error, not a shorter run
DEFAULT_BUDGET_S = {False: 570.0, True: 900.0}  # by --smoke: 570 s leaves 30 s of a 10-minute limit
# TensorBoard: no attention heatmaps (about 20 images per sentence per validation: most of a run's events,
# and slow to draw) and a hard cap on what OUT/tensorboard holds; what is left is scalars and a few texts.
TRAIN_EVENTS = ["eval.n_alignment_sentences=0"]
EVENTS_CAP_BYTES = 8 * 2**20
UNFINISHED = "did not finish: the run was ended during this stage"  # the record a kill leaves
SMOKE_MODEL = [
    "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
]  # fmt: skip
SMOKE_TRAIN = SMOKE_MODEL + [
    "data.vocab_size=300", "data.max_tokens=600", "data.train_limit=400", "data.eval_limit=16",
    "train.device=cpu", "train.precision=fp32", "train.max_steps=12", "train.warmup_steps=4",
    "train.log_every=2", "eval.every_steps=6", "eval.max_tokens=2000", "eval.n_sample_translations=2",
    "eval.max_len_offset=10",
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
    train_overrides: list[str]  # on transformer/configs/multi30k_de_en_gpu.yaml
    checkpoint: str | None  # for decode; None: train's best.pt
    decode_limit: int  # 0: the whole test set
    compile_backend: str


def make_plan(args: argparse.Namespace) -> Plan:
    train = [f"train.max_minutes={args.train_minutes}"] + TRAIN_EVENTS
    if args.smoke:
        return Plan(
            "cpu", "fp32", args.data_dir, SMOKE_MODEL, [600], 2, 300, SMOKE_TRAIN + train,
            args.checkpoint, 8, "eager",
        )  # fmt: skip
    from transformer.runtime.configs import load_config

    sizes = [load_config(BASE_CONFIG).data.max_tokens, load_config(GPU_CONFIG).data.max_tokens]
    return Plan(
        "cuda", "bf16", args.data_dir, [], sizes, 20, 8000, train, args.checkpoint, 0, "inductor"
    )  # fmt: skip


class BudgetError(ValueError):
    """--budget-s cannot hold the chosen stages (with at least MIN_TRAIN_MINUTES of training)."""


def plan_shares(stages: list[str], budget: float, train_minutes: float) -> tuple[dict, float, str | None]:
    """Each stage's share of ``budget`` in seconds, the training minutes that fit, and a note if fewer than
    ``train_minutes``. The shares add up to at most ``budget``: every stage gets its turn."""
    others = sum(SHARES[s] for s in stages if s != "train")
    note = None
    if "train" in stages and others + TRAIN_SETUP_S + train_minutes * 60.0 > budget:
        fitted = math.floor((budget - others - TRAIN_SETUP_S) / 6.0) / 10.0  # minutes, rounded down to 0.1
        if fitted < MIN_TRAIN_MINUTES:
            raise BudgetError(
                f"--budget-s {budget:g} is too small: {others:g} s for the stages besides train, "
                f"{TRAIN_SETUP_S:g} s of train setup and at least {MIN_TRAIN_MINUTES:g} minute of training"
            )
        note = (
            f"--train-minutes {train_minutes:g} does not fit in --budget-s {budget:g} beside the other "
            f"stages ({others:g} s) and train setup ({TRAIN_SETUP_S:g} s): training for {fitted:g} minutes"
        )
        train_minutes = fitted
    needs = {s: SHARES.get(s, train_minutes * 60.0 + TRAIN_SETUP_S) for s in stages}
    if sum(needs.values()) > budget:  # without train (with it, the minutes above made it fit)
        raise BudgetError(f"--budget-s {budget:g} is too small: {', '.join(stages)} need {others:g} s")
    scale = budget / sum(needs.values())  # >= 1: what the budget has to spare goes to every stage alike
    return {s: math.floor(need * scale * 10.0) / 10.0 for s, need in needs.items()}, train_minutes, note


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

    from transformer.runtime.configs import load_config

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
            sizes, batches, vocab, plan.throughput_steps, plan.device, {plan.precision: dtype}, backend
        )
        (ours, ours_flops), (theirs, theirs_flops) = (measured[m, plan.precision] for m in ("ours", "torch"))
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
    from transformer.commands import train

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
        "precision",
    )  # fmt: skip
    history = [{k: e.get(k) for k in ("step", "val_bleu", "val_loss")} for e in results.get("validation", [])]
    return {k: results.get(k) for k in keep} | {"validation": history, "checkpoint": str(run_dir / "best.pt")}


def stage_decode(plan: Plan, work: Path, out: Path, save: Callable[[dict], None]) -> dict:
    import decode_speed
    import torch

    from transformer.runtime.checkpoints import load_for_inference
    from transformer.runtime.precision import autocast_dtype, training_precision
    from transformer.training.multi30k import load_multi30k

    checkpoint = Path(plan.checkpoint) if plan.checkpoint else work / "run" / "best.pt"
    model, tokenizer, config = load_for_inference(checkpoint, plan.device)
    data = config.data
    test = load_multi30k(data.src_lang, data.tgt_lang, plan.data_dir)["test"].head(plan.decode_limit)
    precision = training_precision(config.train.precision, torch.device(plan.device))  # validation's
    dtype = autocast_dtype(precision, torch.device(plan.device))
    beam = 4
    settings = config.eval
    print(f"decoding {len(test)} sentences with {checkpoint} on {plan.device} ({dtype})", flush=True)
    result = decode_speed.measure_decoding(model, tokenizer, settings, test, plan.device, beam, precision)
    info = {
        "checkpoint": str(checkpoint),
        "sentences": len(test),
        "beam": beam,
        "precision": precision,
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


def write_json(path: Path, data: dict) -> None:
    """Through a temporary file and ``os.replace``: a kill at any moment leaves the previous whole file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(temporary, path)


def read_figures(work: Path, name: str) -> dict:
    """WORK/<name>.json, the figures a stage saved so far ({} if none)."""
    path = work / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def end_with_parent(parent: int | None) -> None:
    """End this stage's process group when bench/gpu.py (process ``parent``) is gone, even killed by SIGKILL:
    the stage has its own group (so that its time limit also ends its workers), which a kill of the parent's
    group misses. ``parent`` comes from the command line: the parent may be gone before this runs."""
    if parent is None:  # run by hand, not by run_stage
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        if os.getpgrp() == os.getpid():  # started by run_stage: the group is the stage's alone
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def run_stage_here(name: str, plan: Plan, work: Path, out: Path, parent: int | None) -> int:
    """In the stage's own process: run it, write WORK/<name>.json (figures, or the error)."""
    path = work / f"{name}.json"
    end_with_parent(parent)

    def save(figures: dict) -> None:
        write_json(path, figures)

    try:
        save(STAGE_FUNCTIONS[name](plan, work, out, save))
        return 0
    except Exception as error:
        traceback.print_exc()
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        save(read_figures(work, name) | {"error": f"{type(error).__name__}: {message}"})
        return 1


def run_stage(name: str, argv: list[str], work: Path, seconds: float) -> dict:
    """Run one stage in a child process (its own process group) for at most ``seconds``; its figures."""
    start = time.monotonic()
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--stage", name, "--work", str(work)]
    command += ["--parent", str(os.getpid())]
    child = subprocess.Popen(command, preexec_fn=os.setpgrp)
    try:
        code, timed_out = child.wait(timeout=seconds), False
    except subprocess.TimeoutExpired:
        code, timed_out = None, True
    finally:
        if child.poll() is None:  # timed out, or this process was interrupted: the stage ends too
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    figures = read_figures(work, name)
    if timed_out:
        figures["error"] = f"timed out after {seconds:.0f} s"
    elif code != 0 and "error" not in figures:
        figures["error"] = f"exit code {code}"
    return figures | {"seconds": round(time.monotonic() - start, 1)}


def whole_records(path: Path, limit: int) -> int:
    """The longest start of an event file that is whole records and at most ``limit`` bytes long. An event
    file (TFRecord) is a sequence of records: data length (uint64, little-endian), a 4-byte CRC of it, the
    data, a 4-byte CRC of the data; a file cut between records still reads, without its later events."""
    size, kept = path.stat().st_size, 0
    with path.open("rb") as events:
        while len(header := events.read(8)) == 8:
            end = kept + 8 + 4 + struct.unpack("<Q", header)[0] + 4
            if end > min(limit, size):
                break
            kept = end
            events.seek(kept)
    return kept


def copy_events(run_dir: Path, out: Path, cap: int = EVENTS_CAP_BYTES) -> dict:
    """The run's TensorBoard event files (and its hparams run) into OUT/tensorboard, at most ``cap`` bytes in
    all, smallest first; one that does not fit is cut after its last whole record that does, and the figures
    say so (``tensorboard_cut``). The checkpoints stay behind (a file that comes back must be small)."""
    found = sorted(run_dir.glob("events.out.tfevents.*")) + sorted(run_dir.glob("*/events.out.tfevents.*"))
    copied, cut, room = [], [], cap
    for events in sorted(found, key=lambda path: path.stat().st_size):  # stable: by name among equals
        size = events.stat().st_size
        keep = size if size <= room else whole_records(events, room)
        target = out / "tensorboard" / events.relative_to(run_dir)
        if keep < size:
            cut.append(f"{target.relative_to(out)}: {keep} of {size} bytes (the cap is {cap} bytes)")
        if keep == 0:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with events.open("rb") as source:
            target.write_bytes(source.read(keep))
        room -= keep
        copied.append(str(target.relative_to(out)))
    figures = {"tensorboard": copied, "tensorboard_bytes": cap - room}
    return figures | ({"tensorboard_cut": cut} if cut else {})


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
    parser.add_argument("--data-dir", help="Multi30k folder (else $MULTI30K_DIR, else your data folder)")
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
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # the stage ends when it is gone
    return parser.parse_args(argv)


class Interrupted(Exception):
    """SIGTERM or SIGINT to bench/gpu.py: the running stage ends, is recorded, and no later stage starts."""


def raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_interrupt():
    previous = {s: signal.signal(s, raise_interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def record(results: dict, out: Path, name: str, figures: dict) -> None:
    results["stages"][name] = figures
    results["summary"] = summary(results["stages"])
    write_json(out / "results.json", results)


def run_stages(stages: list[str], shares: dict, argv: list[str], work: Path, out: Path, results: dict) -> int:
    """Each stage for at most what is left of the budget less the later stages' shares: its own share plus
    what the earlier ones left unused. OUT/results.json is written before each stage (the stage marked
    unfinished) and after it. Returns 128 + the signal's number if a signal ended the run, else 0."""
    deadline = time.monotonic() + results["budget_s"]
    name, seconds = stages[0], 0.0
    try:
        for i, name in enumerate(stages):
            seconds = deadline - time.monotonic() - sum(shares[s] for s in stages[i + 1 :])
            print(f"=== {name} (at most {seconds:.0f} s, its share {shares[name]:.0f} s)", flush=True)
            if seconds < MIN_STAGE_S:
                figures = {"error": f"skipped: {max(seconds, 0):.0f} s left for it"}
            else:
                record(results, out, name, {"error": UNFINISHED, "limit_s": round(seconds, 1)})
                figures = run_stage(name, argv, work, seconds)
            figures |= copy_events(work / "run", out) if name == "train" else {}
            record(results, out, name, figures | {"limit_s": round(seconds, 1)})
            print(f"=== {name}: {figures.get('error', 'ok')} ({figures.get('seconds', 0)} s)", flush=True)
    except Interrupted as stop:
        number = stop.args[0]
        figures = read_figures(work, name) | {"error": f"interrupted by {signal.Signals(number).name}"}
        figures |= copy_events(work / "run", out) if name == "train" else {}
        record(results, out, name, figures | {"limit_s": round(seconds, 1)})
        print(f"=== {name}: {figures['error']}; no later stage runs", flush=True)
        return 128 + number
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # run from anywhere, no install
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stage:
        return run_stage_here(args.stage, make_plan(args), Path(args.work), out, args.parent)
    budget, stages = args.budget_s or DEFAULT_BUDGET_S[args.smoke], list(dict.fromkeys(args.stages))
    try:
        shares, minutes, note = plan_shares(stages, budget, args.train_minutes)
    except BudgetError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    print(f"budget {budget:g} s; shares (s): {shares}" + (f"\nnote: {note}" if note else ""), flush=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_bench_"))
    results = {
        "smoke": args.smoke,
        "budget_s": budget,
        "shares_s": shares,
        "train_minutes": minutes,
        "note": note,
        "work": str(work),
        "started": time.ctime(),
        "stages": {},
    }
    with signals_interrupt():
        code = run_stages(stages, shares, argv + ["--train-minutes", f"{minutes:g}"], work, out, results)
    print(json.dumps(results["summary"], indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)  # checkpoints of the train stage: too big to bring back
    failed = [name for name, figures in results["stages"].items() if "error" in figures]
    print(f"results: {out / 'results.json'}; failed stages: {', '.join(failed) or 'none'}")
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
