"""Decoding speed: greedy with the key/value cache vs. recomputing the whole prefix every step, and beam 4.

Decodes Multi30k test_2016_flickr (1000 sentences, in the checkpoint's direction, de→en for the default
config) with one checkpoint and the same length-sorted batches three ways, one run each: cached greedy,
uncached greedy (``use_cache=False``) and beam search (K=4, α=0.6 unless ``--length-penalty``, cached).
Reports sentences per second and BLEU, and checks that the cached and uncached outputs are identical. Then
cached greedy and beam search again on the plain core (``--no-fast``): its speed beside the fast tier's,
and how many lines differ.

    python bench/decode_speed.py --checkpoint RUN/best.pt [--data-dir DIR] [--limit N] [--max-tokens N]

The checkpoint may be a training one or an inference-only one made beforehand with
``python -m transformer.interop.slim RUN/best.pt model.pt`` (config, weights and tokenizer: small enough to
copy to another machine). Without --checkpoint it uses runs/decode_bench/best.pt if it is there; otherwise it
refuses, unless ``--train-minutes N`` asks it to train one first with train.py (multi30k_de_en).

Last lines: fast_vs_plain_greedy= and fast_vs_plain_beam=<the fast tier's sentences/s ÷ the plain
core's>, speedup_cache=<cached greedy sentences/s ÷ uncached greedy sentences/s>.

``--compare`` measures instead our decoding against the inference engines users deploy with: the checkpoint is
exported (``transformer.interop.marian.export``) to a transformers folder and a CTranslate2 model, and the
same sentences in the same length-sorted batches are decoded greedily by ours in fp32, int8 (``--precision
int8``: torchao int8 linear layers), int8-bf16 (the same int8 weights, bf16 products) and bf16 (a bf16 copy),
by ``generate(num_beams=1)`` (of ``MarianMTModel``, or ``PegasusForConditionalGeneration`` for a pre-norm
model) and by ``ctranslate2.Translator.translate_batch(beam_size=1)`` in fp32 and int8 (in a process of its
own: ``ct2_worker.py`` says why); then with ``--beam`` beams (default 4) by ours, ``generate(num_beams=4)``
and CTranslate2 fp32, each with the length penalty α of ``--length-penalty`` (default 0.6; ours is GNMT's
((5 + length) / 6)^α, theirs length^α: the same α, not the
same formula, so their beams may pick other lines). Per engine:
sentences/s, BLEU and how many lines differ from ours (token ids compared; the same detokenizer for all).
Lengths: ours stops each sentence at source length + ``eval.max_len_offset``; generate() and CTranslate2
take one limit per call, so each batch gets its largest sentence limit L (``max_length=1 + L`` /
``max_decoding_length=L``, ``min_decoding_length=0``) and each output is then cut at its own sentence's
limit, which is exact for greedy search (a row's tokens do not depend on the other rows'). The engines
take turns, ``--rounds`` times (default 3), and each one's fastest round counts: on a shared machine a slow
phase then hits all of them, where one run each could hand one engine the slow minute. Last lines,
ours ÷ theirs in sentences/s: ``ratio_bf16_vs_ct2_int8=``, ``ratio_int8_bf16_vs_ct2_int8=``, then
``ratio_vs_hf=``, ``ratio_vs_ct2=`` (greedy fp32), ``ratio_int8_vs_ct2_int8=``, ``ratio_beam4_vs_hf=``,
``ratio_beam4_vs_ct2=``.

    python bench/decode_speed.py --compare --checkpoint RUN/best.pt [--limit N] [--rounds N] [--export-dir D]
"""

import argparse
import copy
import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from ct2_worker import CTranslate2Process  # bench/, beside this file

from transformer.core.batches import make_batches
from transformer.core.checkpoint import CheckpointError
from transformer.inference.translator import Translator
from transformer.runtime.checkpoints import load_for_inference
from transformer.runtime.memory import keep_freed_memory
from transformer.runtime.metrics import bleu_chrf
from transformer.training.multi30k import load_multi30k

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN = ROOT / "runs" / "decode_bench"


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help=f"training or slim checkpoint (default: {DEFAULT_RUN}/best.pt)")
    parser.add_argument("--data-dir", help="Multi30k folder (else $MULTI30K_DIR, else your data folder)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N test sentences (smoke runs)")
    parser.add_argument("--max-tokens", type=int, help="batch size (default: checkpoint eval.max_tokens)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument(
        "--length-penalty", type=float, default=0.6,
        help="beam search's α for every engine (default 0.6, the paper's, whatever the checkpoint's: the "
        "engines' formulas differ, and at larger α length^α lengthens their beams far more than ours)",
    )  # fmt: skip
    parser.add_argument("--train-minutes", type=float, help="no checkpoint: train one first for N minutes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--compare", action="store_true", help="ours vs transformers generate() vs CTranslate2"
    )
    parser.add_argument(
        "--rounds",
        type=_at_least_one,
        default=3,
        help="--compare: timed runs per engine, in turn; the fastest counts",
    )
    parser.add_argument("--export-dir", help="--compare: keep the exported models here (default: a temp dir)")
    return parser.parse_args(argv)


def train_checkpoint(data_dir: str | None, minutes: float) -> Path:
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", "multi30k_de_en",
        "--run-dir", str(DEFAULT_RUN), "--set", f"train.max_minutes={minutes}", "--set", "eval.every_steps=0",
    ] + (["--data-dir", data_dir] if data_dir else [])  # fmt: skip
    print(f"no checkpoint given: training one ({minutes} min budget) into {DEFAULT_RUN}", flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return DEFAULT_RUN / "best.pt"


def decode(translator: Translator, src_ids, method: dict) -> tuple[list[list[int]], float]:
    """(outputs in input order, seconds) of ``Translator.search`` with the decoding options in ``method``."""
    sync = torch.cuda.synchronize if translator.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    use_cache = method.pop("use_cache", True)
    settings = dataclasses.replace(translator.settings, **method)
    outputs = translator.search(src_ids, settings, use_cache=use_cache)
    sync()
    return outputs, time.perf_counter() - start


def measure_decoding(
    model, tokenizer, settings, test, device, beam: int, precision: str = "fp32", log=print
) -> dict:
    """Decode ``test`` (a ParallelText) three ways with the same batches (``settings``: an EvalConfig):
    {method: {seconds, sentences_per_s, bleu, chrf, mean_output_tokens}} plus whether cached and uncached
    greedy agree and the sacreBLEU signature. One warm-up on 8 sentences first."""
    src_ids = tokenizer.encode_batch(test.src)
    plain = Translator(copy.deepcopy(model), tokenizer, settings, device, precision, fast=False)
    translator = Translator(model, tokenizer, settings, device, precision)
    methods = {
        "greedy_cache": {"beam_size": 1},
        "greedy_no_cache": {"beam_size": 1, "use_cache": False},
        f"beam{beam}_cache": {"beam_size": beam},
        "greedy_plain": {"beam_size": 1, "plain": True},
        f"beam{beam}_plain": {"beam_size": beam, "plain": True},
    }
    for method in methods.values():  # warm-up: first-call allocations are no one's cost
        method = dict(method)
        decode(plain if method.pop("plain", False) else translator, src_ids[:8], method)
    results, outputs = {}, {}
    for name, method in methods.items():
        method = dict(method)
        by = plain if method.pop("plain", False) else translator
        outputs[name], seconds = decode(by, src_ids, method)
        scores = bleu_chrf(tokenizer.decode_batch(outputs[name]), test.tgt)
        results[name] = {
            "seconds": seconds,
            "sentences_per_s": len(src_ids) / seconds,
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "mean_output_tokens": sum(len(o) for o in outputs[name]) / max(len(outputs[name]), 1),
        }
        log(
            f"{name:>16}: {seconds:7.1f} s  {results[name]['sentences_per_s']:8.1f} sentences/s  "
            f"BLEU {scores['bleu']:5.2f}  mean output {results[name]['mean_output_tokens']:.1f} tokens"
        )
        results["signature"] = scores["signature"]
    cached, uncached = outputs["greedy_cache"], outputs["greedy_no_cache"]
    results["cache_differs"] = sum(a != b for a, b in zip(cached, uncached))
    for kind, fast_name in (("greedy", "greedy_cache"), ("beam", f"beam{beam}_cache")):
        plain_name = f"{fast_name.split('_')[0]}_plain"
        results[f"plain_differs_{kind}"] = sum(
            a != b for a, b in zip(outputs[fast_name], outputs[plain_name])
        )
        results[f"fast_vs_plain_{kind}"] = (
            results[fast_name]["sentences_per_s"] / results[plain_name]["sentences_per_s"]
        )
    results["speedup_cache"] = (
        results["greedy_cache"]["sentences_per_s"] / results["greedy_no_cache"]["sentences_per_s"]
    )
    return results


# -------- --compare: ours vs transformers generate() vs CTranslate2 -----------------------------------


def sentence_limits(src_ids: list[list[int]], max_len_offset: int, max_positions: int) -> list[int]:
    """Our per-sentence length limit (``decoding.max_lengths``): source + EOS + offset, EOS included."""
    return [max(1, min(len(ids) + 1 + max_len_offset, max_positions)) for ids in src_ids]


def length_batches(src_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The batches ``Translator.search`` decodes: sorted by length, at most ``max_tokens`` padded tokens."""
    lengths = [len(ids) for ids in src_ids]
    return make_batches(lengths, lengths, max_tokens, shuffle=False)


def cut(tokens: list[int], limit: int, eos_id: int) -> list[int]:
    """A greedy output with a longer limit -> ours: its first ``limit`` tokens, up to EOS (excluded)."""
    tokens = tokens[:limit]
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def decode_transformers(
    hf_model, src_ids, tokenizer, settings, max_positions: int, device, beam: int = 1
) -> list[list[int]]:
    """``generate()`` (the exported generation config: start from BOS, never PAD or BOS) over our batches,
    greedy or with ``beam`` beams; one limit per batch, each output cut at its own."""
    pad, eos = tokenizer.pad_id, tokenizer.eos_id
    limits = sentence_limits(src_ids, settings.max_len_offset, max_positions)
    search = {"num_beams": beam, "length_penalty": settings.length_penalty} if beam > 1 else {"num_beams": 1}
    outputs: list[list[int]] = [[] for _ in src_ids]
    for batch in length_batches(src_ids, settings.max_tokens):
        rows = [src_ids[i] + [eos] for i in batch]
        S = max(len(row) for row in rows)
        src = torch.tensor([row + [pad] * (S - len(row)) for row in rows], device=device)  # (B, S)
        generated = hf_model.generate(
            input_ids=src, attention_mask=src != pad, do_sample=False,
            max_length=1 + max(limits[i] for i in batch), **search,
        )  # fmt: skip
        for i, row in zip(batch, generated[:, 1:].tolist()):  # (B, 1 + L): drop the start token
            outputs[i] = cut(row, limits[i], eos)
    return outputs


def decode_ctranslate2(
    worker: CTranslate2Process, compute_type: str, src_ids, tokenizer, settings, max_positions: int, beam=1
) -> tuple[list[list[int]], float]:
    """``translate_batch`` over our batches (pieces in, pieces out), greedy or with ``beam`` beams, in the
    worker process (``ct2_worker.py``: why): (outputs, seconds). One limit per batch, each output cut at its
    own; ``min_decoding_length=0`` as ours may produce an empty one. The seconds are those of this function's
    own work (pieces in, ids out) and of the worker's ``translate_batch`` calls, as when both ran here: the
    requests' trips through the pipe are left out."""
    start = time.perf_counter()
    eos = tokenizer.eos_id
    pieces = tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))
    ids = {piece: i for i, piece in enumerate(pieces)}
    limits = sentence_limits(src_ids, settings.max_len_offset, max_positions)
    batches = length_batches(src_ids, settings.max_tokens)
    sources = [[[pieces[t] for t in src_ids[i]] + [pieces[eos]] for i in batch] for batch in batches]
    max_lengths = [max(limits[i] for i in batch) for batch in batches]
    preparing = time.perf_counter() - start
    hypotheses, translating = worker.translate(
        compute_type, sources, max_lengths, beam, settings.length_penalty
    )
    start = time.perf_counter()
    outputs: list[list[int]] = [[] for _ in src_ids]
    for i, hypothesis in zip((i for batch in batches for i in batch), hypotheses, strict=True):
        outputs[i] = cut([ids[piece] for piece in hypothesis], limits[i], eos)
    return outputs, preparing + translating + time.perf_counter() - start


OURS, OURS_BEAM = "ours (cached greedy)", "ours beam {beam}"
RATIOS = {  # the last lines: ratio_<name>=<first engine's sentences/s ÷ the second's>
    "bf16_vs_ct2_int8": ("ours bf16 (cached greedy)", "CTranslate2 int8"),
    "int8_bf16_vs_ct2_int8": ("ours int8-bf16 (cached greedy)", "CTranslate2 int8"),
    "vs_hf": (OURS, "transformers generate()"),
    "vs_ct2": (OURS, "CTranslate2 float32"),
    "int8_vs_ct2_int8": ("ours int8 (cached greedy)", "CTranslate2 int8"),
    "beam{beam}_vs_hf": (OURS_BEAM, "transformers generate() beam {beam}"),
    "beam{beam}_vs_ct2": (OURS_BEAM, "CTranslate2 float32 beam {beam}"),
}


def load_engines(
    model, tokenizer, settings, export_dir: Path, worker: CTranslate2Process, device: str, beam: int
):
    """{name: (src_ids -> (outputs, seconds), the engine whose lines it is compared with)}: ours in fp32,
    int8, int8-bf16 and bf16 (the last three on the CPU), the checkpoint's export in ``export_dir`` in
    transformers and CTranslate2 (fp32, int8, in ``worker``'s process), each greedy; then ours, generate()
    and CTranslate2 fp32 with ``beam`` beams."""
    from transformer.interop.released import load_pretrained

    hf_model = load_pretrained(export_dir / "hf")[0].to(device).eval()  # Marian, or Pegasus if pre-norm
    cpu = not device.startswith("cuda")
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    limits = dict(settings=settings, max_positions=model.config.max_positions)

    def ours(precision: str, k: int):
        translator = Translator(model, tokenizer, settings, device, precision)
        return lambda ids: decode(translator, ids, {"beam_size": k})

    def hf(k: int):
        def run(ids):
            sync()
            start = time.perf_counter()
            outputs = decode_transformers(hf_model, ids, tokenizer, device=device, beam=k, **limits)
            sync()
            return outputs, time.perf_counter() - start

        return run

    def ctranslate(kind: str, k: int):
        return lambda ids: decode_ctranslate2(worker, kind, ids, tokenizer, beam=k, **limits)

    beam_name = OURS_BEAM.format(beam=beam)
    engines = {OURS: (ours("fp32", 1), OURS)}
    engines |= {f"ours {p} (cached greedy)": (ours(p, 1), OURS) for p in ("int8", "int8-bf16", "bf16") if cpu}
    engines["transformers generate()"] = (hf(1), OURS)
    engines |= {f"CTranslate2 {kind}": (ctranslate(kind, 1), OURS) for kind in ("float32", "int8")}
    engines[beam_name] = (ours("fp32", beam), beam_name)
    engines[f"transformers generate() beam {beam}"] = (hf(beam), beam_name)
    engines[f"CTranslate2 float32 beam {beam}"] = (ctranslate("float32", beam), beam_name)
    return engines


def time_engines(engines: dict, src_ids: list[list[int]], rounds: int) -> tuple[dict, dict]:
    """Every engine decodes ``src_ids`` once per round, in turn (after one warm-up on 8 sentences each):
    {name: outputs}, {name: the fastest round's seconds}, as each engine timed itself. Round-robin, so that a
    slow phase of a shared machine hits every engine alike."""
    outputs, seconds = {}, {}
    with torch.no_grad():
        for engine, _ in engines.values():
            engine(src_ids[:8])
        for _ in range(rounds):
            for name, (engine, _) in engines.items():
                outputs[name], took = engine(src_ids)
                seconds[name] = min(seconds.get(name, float("inf")), took)
    return outputs, seconds


def compare_engines(model, tokenizer, settings, test, checkpoint, args, log=print) -> dict:
    """Decode ``test`` with every engine (``time_engines``, ``--rounds`` rounds): {name: {seconds,
    sentences_per_s, bleu, chrf, differ, at_limit}} and the ratios of ``RATIOS``."""
    src_ids = tokenizer.encode_batch(test.src)
    limits = sentence_limits(src_ids, settings.max_len_offset, model.config.max_positions)
    from transformer.interop.marian import export

    if importlib.util.find_spec("ctranslate2") is None:  # not imported here: it runs in the worker
        raise ImportError("No module named 'ctranslate2'")
    with tempfile.TemporaryDirectory() as tmp:
        export_dir = Path(args.export_dir or tmp)
        export(checkpoint, export_dir / "hf", export_dir / "ct2")
        log(f"exported to {export_dir}/hf (transformers) and {export_dir}/ct2 (CTranslate2)", flush=True)
        threads = torch.get_num_threads()
        with CTranslate2Process(export_dir / "ct2", args.device, ["float32", "int8"], threads) as worker:
            if worker.torch_loaded:
                log("warning: importing ctranslate2 loaded torch into its worker process too", flush=True)
            engines = load_engines(model, tokenizer, settings, export_dir, worker, args.device, args.beam)
            outputs, seconds = time_engines(engines, src_ids, args.rounds)
    results = {}
    for name, (_, reference) in engines.items():
        scores = bleu_chrf(tokenizer.decode_batch(outputs[name]), test.tgt)
        differ = sum(a != b for a, b in zip(outputs[name], outputs[reference]))
        results[name] = r = {
            "seconds": seconds[name], "sentences_per_s": len(src_ids) / seconds[name], "bleu": scores["bleu"],
            "chrf": scores["chrf"], "differ": differ,
            "at_limit": sum(len(o) == limit for o, limit in zip(outputs[name], limits)),
        }  # fmt: skip
        log(
            f"{name:>32}: {r['seconds']:7.1f} s  {r['sentences_per_s']:8.1f} sentences/s  BLEU "
            f"{r['bleu']:5.2f}  lines differing from {reference}: {r['differ']} of {len(src_ids)}  "
            f"(stopped at the length limit: {r['at_limit']})",
            flush=True,
        )
    for ratio, (mine, theirs) in RATIOS.items():
        mine, theirs = mine.format(beam=args.beam), theirs.format(beam=args.beam)
        if mine in results and theirs in results:
            speed = results[mine]["sentences_per_s"] / results[theirs]["sentences_per_s"]
            results[f"ratio_{ratio.format(beam=args.beam)}"] = speed
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    checkpoint = Path(args.checkpoint) if args.checkpoint else DEFAULT_RUN / "best.pt"
    if args.checkpoint is None and not checkpoint.is_file():
        if args.train_minutes is None:
            print(
                f"error: no checkpoint ({checkpoint} does not exist): pass --checkpoint RUN/best.pt (or an "
                "inference-only one from python -m transformer.interop.slim), or --train-minutes N to train "
                "one",
                file=sys.stderr,
            )
            return 1
        checkpoint = train_checkpoint(args.data_dir, args.train_minutes)
    try:
        model, tokenizer, config = load_for_inference(checkpoint, args.device)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    keep_freed_memory(torch.device(args.device))  # as translate.py does, for every engine of this process
    data = config.data
    test = load_multi30k(data.src_lang, data.tgt_lang, args.data_dir)["test"].head(args.limit)
    settings = dataclasses.replace(
        config.eval,
        max_tokens=args.max_tokens or config.eval.max_tokens,
        length_penalty=args.length_penalty,
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{checkpoint}: {n_params / 1e6:.2f}M parameters, {data.src_lang}→{data.tgt_lang}, {len(test)} "
        f"sentences, batches of <= {settings.max_tokens} tokens, {args.device}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    if args.compare:
        try:
            results = compare_engines(model, tokenizer, settings, test, checkpoint, args)
        except ImportError as error:
            print(f'error: --compare needs transformers and ctranslate2 (pip install -e ".[hf]"): {error}',
                  file=sys.stderr)  # fmt: skip
            return 1
        for name in (k for k in results if k.startswith("ratio_")):
            print(f"{name}={results[name]:.2f}")
        return 0
    results = measure_decoding(
        model, tokenizer, settings, test, args.device, args.beam, log=lambda line: print(line, flush=True)
    )
    differ = results["cache_differs"]
    print(
        "cached and uncached greedy outputs identical: "
        + ("yes" if differ == 0 else f"NO, {differ} of {len(test)} sentences differ")
    )
    for kind in ("greedy", "beam"):
        print(f"plain core's {kind} lines differing from the fast tier's: {results[f'plain_differs_{kind}']}")
    print(f"fast_vs_plain_greedy={results['fast_vs_plain_greedy']:.2f}")
    print(f"fast_vs_plain_beam={results['fast_vs_plain_beam']:.2f}")
    print(f"speedup_cache={results['speedup_cache']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
