"""Validation during training and the final test: the loss, and translations decoded by the core's search
(``runtime/search.py``, with the fast tier's kernels under ``train.fast``) in the precision the run trains
in, scored with BLEU / chrF.
"""

import dataclasses
import time

import torch
from tqdm import tqdm

from transformer.core.batches import iter_batches, make_batches
from transformer.core.config import EvalConfig
from transformer.core.model import Transformer
from transformer.runtime.attention_maps import pair_attention
from transformer.runtime.metrics import bleu_chrf, evaluate_loss
from transformer.runtime.precision import autocast, decoding_model
from transformer.runtime.search import ended_with_eos, kernels_for, search
from transformer.training import reporting
from transformer.training.ranks import Runtime
from transformer.training.run import Run


def translate_split(
    model: Transformer, src_ids: list[list[int]], settings: EvalConfig, runtime: Runtime, progress: str,
    fast: bool = True,
) -> tuple[Transformer, torch.dtype | None, list[list[int]]]:  # fmt: skip
    """(the model as decoded: a bf16 copy on a CPU that trains in bf16, with the fast tier's modules when
    ``fast``; the autocast dtype it decodes under; the ids of every translation, in order)."""
    decoding, dtype = decoding_model(model, runtime.precision, runtime.device)
    decoding, kernels = kernels_for(decoding, fast)
    bar = tqdm(total=len(src_ids), desc=progress, unit="sent", leave=False)
    with autocast(runtime.device, dtype):
        hyp_ids = search(decoding, src_ids, settings, bar.update, kernels)
    bar.close()
    return decoding, dtype, hyp_ids


def translate_and_score(
    model: Transformer, tokenizer, src_ids: list[list[int]], references: list[str], settings: EvalConfig,
    runtime: Runtime, progress: str = "test", fast: bool = True,
) -> tuple[list[str], dict[str, float | str]]:  # fmt: skip
    """Translate a split with ``settings`` (beam size, length penalty) and score it: (detokenized
    translations, ``bleu_chrf``)."""
    _, _, hyp_ids = translate_split(model, src_ids, settings, runtime, progress, fast)
    hyps = tokenizer.decode_batch(hyp_ids)
    return hyps, bleu_chrf(hyps, references)


def validate(run: Run, model: Transformer) -> dict:
    """Validation loss and greedy BLEU / chrF of ``model`` (rank 0), logged and printed, with the attention
    heatmaps of the first ``eval.n_alignment_sentences`` sentences (of each corpus); returns the history
    entry. With several corpora, BLEU and chrF are their corpora's mean, each one's also in the entry."""
    t0, settings, state, rt = time.perf_counter(), run.config.eval, run.state, run.runtime
    (src_ids, tgt_ids), refs = run.splits.valid, run.splits.valid_refs
    batches = make_batches([len(s) for s in src_ids], [len(t) for t in tgt_ids], settings.max_tokens, False)
    batched = iter_batches(src_ids, tgt_ids, batches, *model.pad_start_eos)
    loss = evaluate_loss(model, batched, rt.device, rt.autocast)  # as training computes it
    greedy = dataclasses.replace(settings, beam_size=1)
    decoding, dtype, hyp_ids = translate_split(model, src_ids, greedy, rt, "validate", run.config.train.fast)
    hyps = run.tokenizer.decode_batch(hyp_ids)
    scores, by_part = scores_by_part(hyps, refs, run.splits.parts, "valid")
    entry = {"step": state.step, "epoch": state.epoch}
    entry |= {f"val_{key}": (loss | scores)[key] for key in ("loss", "ppl", "bleu", "chrf")}
    entry |= {"val_corpora": by_part} if by_part else {}
    attentions, samples = {}, []
    for part in run.splits.parts:  # each corpus's first sentences (one corpus: tags as they always were)
        tag = f"{part.name}/" if by_part else ""
        first = range(part.valid.start, part.valid.stop)
        with torch.no_grad(), autocast(rt.device, dtype):
            for n, i in enumerate(first[: settings.n_alignment_sentences]):
                ended = ended_with_eos(decoding, src_ids[i], hyp_ids[i], settings.max_len_offset)
                attentions[f"{tag}sentence_{n}"] = pair_attention(
                    decoding, run.tokenizer, src_ids[i], hyp_ids[i], ended
                )
                if settings.alignment_references:  # the reference, teacher-forced
                    reference = pair_attention(decoding, run.tokenizer, src_ids[i], tgt_ids[i], True)
                    attentions[f"{tag}sentence_{n}/reference"] = reference
        shown = first[: settings.n_sample_translations]
        sources = run.tokenizer.decode_batch([src_ids[i] for i in shown])
        samples += [(source, refs[i], hyps[i]) for source, i in zip(sources, shown)]
    reporting.log_validation(run.writer, entry, samples, attentions)
    print(reporting.validation_line(entry, time.perf_counter() - t0), flush=True)
    return entry


def scores_by_part(hyps: list[str], refs: list[str], parts: list, split: str) -> tuple[dict, dict]:
    """(BLEU / chrF of the whole split, {}) with one corpus; with several, (their mean, {corpus: its
    ``bleu_chrf``}), ``split`` ("valid" or "test") saying which slice of each corpus's (``PartSplits``)."""
    if len(parts) <= 1:
        return bleu_chrf(hyps, refs), {}
    by_part = {}
    for part in parts:
        where = getattr(part, split)
        if where.stop == where.start:  # a corpus without this split (it trains only)
            continue
        by_part[part.name] = bleu_chrf(hyps[where], refs[where]) | {"sentences": where.stop - where.start}
    mean = {key: sum(scores[key] for scores in by_part.values()) / len(by_part) for key in ("bleu", "chrf")}
    return mean | {"signature": next(iter(by_part.values()))["signature"]}, by_part


def score_test_set(run: Run, model: Transformer, tokenizer) -> tuple[list[str], dict, dict]:
    """The test set decoded with the ``eval`` settings: (translations, scores, {corpus: scores}), with
    several corpora their mean and each one's (``scores_by_part``), each one's translations also in
    RUN_DIR/test_hypotheses.<corpus>.txt (rank 0)."""
    (src_ids, _), refs, parts = run.splits.test, run.splits.test_refs, run.splits.parts
    fast = run.config.train.fast
    hyps, _ = translate_and_score(model, tokenizer, src_ids, refs, run.config.eval, run.runtime, "test", fast)
    scores, by_part = scores_by_part(hyps, refs, parts, "test")
    for part in [part for part in parts if part.name in by_part]:
        text = "".join(h + "\n" for h in hyps[part.test])
        (run.run_dir / f"test_hypotheses.{part.name}.txt").write_text(text, "utf-8")
        print(
            f"test {part.name}: BLEU {by_part[part.name]['bleu']:.2f} chrF {by_part[part.name]['chrf']:.2f}"
        )
    return hyps, scores, by_part


def score_other_test_sets(run: Run, model: Transformer, tokenizer) -> dict[str, dict]:
    """``eval.test_sets``, each decoded like the test set: {name: BLEU, chrF, signature, sentences}, logged
    to TensorBoard (test/NAME/bleu, .../chrf) and written to RUN_DIR/test_hypotheses.NAME.txt (rank 0)."""
    results = {}
    for name, ((src_ids, _), refs) in run.splits.other_tests.items():
        hyps, scores = translate_and_score(
            model,
            tokenizer,
            src_ids,
            refs,
            run.config.eval,
            run.runtime,
            f"test {name}",
            run.config.train.fast,
        )
        results[name] = scores | {"sentences": len(refs)}
        (run.run_dir / f"test_hypotheses.{name}.txt").write_text("".join(h + "\n" for h in hyps), "utf-8")
        for metric in ("bleu", "chrf"):
            run.writer.add_scalar(f"test/{name}/{metric}", scores[metric], run.state.step)
        print(f"test set {name}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}", flush=True)
    return results
