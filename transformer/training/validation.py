"""Validation during training and the final test: the loss, and translations decoded by the core's search
(``core/batched_search.py``) in the precision the run trains in, scored with BLEU / chrF.
"""

import dataclasses
import time

import torch
from tqdm import tqdm

from transformer.core.batched_search import search
from transformer.core.batches import iter_batches, make_batches
from transformer.core.config import EvalConfig
from transformer.core.decoding import ended_with_eos
from transformer.core.model import Transformer
from transformer.training import reporting
from transformer.training.attention_maps import pair_attention
from transformer.training.metrics import bleu_chrf, evaluate_loss
from transformer.training.precision import autocast, decoding_model
from transformer.training.ranks import Runtime
from transformer.training.run import Run


def translate_split(
    model: Transformer, src_ids: list[list[int]], settings: EvalConfig, runtime: Runtime, progress: str
) -> tuple[Transformer, torch.dtype | None, list[list[int]]]:
    """(the model as decoded: a bf16 copy on a CPU that trains in bf16; the autocast dtype it decodes
    under; the ids of every translation, in order)."""
    decoding, dtype = decoding_model(model, runtime.precision, runtime.device)
    bar = tqdm(total=len(src_ids), desc=progress, unit="sent", leave=False)
    with autocast(runtime.device, dtype):
        hyp_ids = search(decoding, src_ids, settings, bar.update)
    bar.close()
    return decoding, dtype, hyp_ids


def translate_and_score(
    model: Transformer, tokenizer, src_ids: list[list[int]], references: list[str], settings: EvalConfig,
    runtime: Runtime, progress: str = "test",
) -> tuple[list[str], dict[str, float | str]]:  # fmt: skip
    """Translate a split with ``settings`` (beam size, length penalty) and score it: (detokenized
    translations, ``bleu_chrf``)."""
    _, _, hyp_ids = translate_split(model, src_ids, settings, runtime, progress)
    hyps = tokenizer.decode_batch(hyp_ids)
    return hyps, bleu_chrf(hyps, references)


def validate(run: Run, model: Transformer) -> dict:
    """Validation loss and greedy BLEU / chrF of ``model`` (rank 0), logged and printed, with the attention
    heatmaps of the first ``eval.n_alignment_sentences`` sentences; returns the history entry."""
    t0, settings, state, rt = time.perf_counter(), run.config.eval, run.state, run.runtime
    (src_ids, tgt_ids), refs = run.splits.valid, run.splits.valid_refs
    batches = make_batches([len(s) for s in src_ids], [len(t) for t in tgt_ids], settings.max_tokens, False)
    batched = iter_batches(src_ids, tgt_ids, batches, *model.pad_start_eos)
    loss = evaluate_loss(model, batched, rt.device, rt.autocast)  # as training computes it
    greedy = dataclasses.replace(settings, beam_size=1)
    decoding, dtype, hyp_ids = translate_split(model, src_ids, greedy, rt, "validate")
    hyps = run.tokenizer.decode_batch(hyp_ids)
    scores = bleu_chrf(hyps, refs)
    entry = {"step": state.step, "epoch": state.epoch}
    entry |= {f"val_{key}": (loss | scores)[key] for key in ("loss", "ppl", "bleu", "chrf")}
    attentions = {}
    with torch.no_grad(), autocast(rt.device, dtype):
        for n in range(min(settings.n_alignment_sentences, len(src_ids))):
            ended = ended_with_eos(decoding, src_ids[n], hyp_ids[n], settings.max_len_offset)
            attentions[f"sentence_{n}"] = pair_attention(
                decoding, run.tokenizer, src_ids[n], hyp_ids[n], ended
            )
            if settings.alignment_references:  # the reference, teacher-forced
                reference = pair_attention(decoding, run.tokenizer, src_ids[n], tgt_ids[n], True)
                attentions[f"sentence_{n}/reference"] = reference
    n_samples = min(settings.n_sample_translations, len(hyps))
    sources = run.tokenizer.decode_batch(src_ids[:n_samples])
    reporting.log_validation(run.writer, entry, list(zip(sources, refs, hyps)), attentions)
    print(reporting.validation_line(entry, time.perf_counter() - t0), flush=True)
    return entry


def score_other_test_sets(run: Run, model: Transformer, tokenizer) -> dict[str, dict]:
    """``eval.test_sets``, each decoded like the test set: {name: BLEU, chrF, signature, sentences}, logged
    to TensorBoard (test/NAME/bleu, .../chrf) and written to RUN_DIR/test_hypotheses.NAME.txt (rank 0)."""
    results = {}
    for name, ((src_ids, _), refs) in run.splits.other_tests.items():
        hyps, scores = translate_and_score(
            model, tokenizer, src_ids, refs, run.config.eval, run.runtime, f"test {name}"
        )
        results[name] = scores | {"sentences": len(refs)}
        (run.run_dir / f"test_hypotheses.{name}.txt").write_text("".join(h + "\n" for h in hyps), "utf-8")
        for metric in ("bleu", "chrf"):
            run.writer.add_scalar(f"test/{name}/{metric}", scores[metric], run.state.step)
        print(f"test set {name}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}", flush=True)
    return results
