"""What a job gets back: its texts decoded together with the other jobs of its group, each answer with what
was asked (scores, n-best lists, word alignments, attention), and a failure kept to the job that caused it.

Attention comes back compact: every layer's and head's cross-attention weights as one float16 array,
little-endian, base64, with its shape [layers, heads, target pieces, source pieces]: under 3 bytes a weight,
where a JSON number rounded to 5 decimals takes about 9, and no Python float per weight on the way. The
service's limits on attention requests (``schema.py``) bound its size.
"""

import base64
import logging

import numpy as np

from transformer.inference.alignment import pharaoh
from transformer.inference.translator import Translator

log = logging.getLogger("transformer.serving")


def answer_group(translator: Translator, jobs: list) -> list[list | Exception]:
    """Per job (same decoding options) its answers, one per text, or the exception it failed with. The
    jobs are decoded together; if that fails, each is decoded alone, so that only a failing job fails."""
    if not jobs:
        return []
    try:
        return answer_jobs(translator, jobs)
    except Exception as error:  # noqa: BLE001 -- handed to the job's caller (app.py: 422 or 500)
        if len(jobs) > 1:
            return [answer_group(translator, [job])[0] for job in jobs]
        if not isinstance(error, ValueError):
            log.exception("a job failed")
        return [error]


def answer_jobs(translator: Translator, jobs: list) -> list[list]:
    """Decode the texts of jobs with the same options in one call; per job, one answer per text."""
    beam, nbest, with_scores = jobs[0].group
    prefixes = None
    if any(job.prefixes for job in jobs):
        prefix_texts = [p for job in jobs for p in (job.prefixes or [""] * len(job.texts))]
        prefixes = translator.encode_targets(prefix_texts, "texts.{n}.prefix")
    constraints = None
    if any(job.constraints for job in jobs):
        phrases = [c for job in jobs for c in (job.constraints or [[]] * len(job.texts))]
        constraints = translator.encode_constraints(phrases, "texts.{n}.constraints")
    sources = [ids for job in jobs for ids in translator.encode(job.texts, "texts.{n}", job.target_lang)]
    found = translator.translate_ids(
        sources, beam, nbest if nbest > 1 else None, with_scores, prefixes, None, constraints
    )
    answers, start = [], 0
    for job in jobs:
        rows = range(start, start + len(job.texts))
        answers.append([answer(translator, job, sources[i], found[i]) for i in rows])
        start += len(job.texts)
    return answers


def answer(translator: Translator, job, source: list[int] | None, hyps) -> dict | list[dict]:
    """One text's answer: its translation (``nbest`` > 1: a list of them, best first) with what was asked."""
    entries = []
    for rank, hyp in enumerate(hyps):
        entry = {"text": translator.decode(hyp.ids)}
        if job.with_scores or job.nbest > 1:
            entry["score"] = hyp.log_prob
        if not hyp.met:  # a text with constraints that no translation within the length limit holds
            entry["met"] = False
        if rank == 0 and (job.alignments or job.attention) and source is not None:
            attention = translator.attention_ids(source, hyp.ids, hyp.ended)
            if job.alignments:
                entry["alignment"] = pharaoh(translator.alignments_of(attention))
            if job.attention:
                entry["attention"] = {
                    "source_pieces": attention.source_pieces,
                    "target_pieces": attention.target_pieces,
                    "cross": packed(np.stack([layer.float().numpy() for layer in attention.cross])),
                }
        entries.append(entry)
    return entries if job.nbest > 1 else entries[0]


def packed(weights: np.ndarray) -> dict:
    """An array as {"dtype": "float16", "shape": [...], "data": base64 of its little-endian bytes}."""
    half = np.ascontiguousarray(weights, dtype="<f2")
    return {"dtype": "float16", "shape": list(half.shape), "data": base64.b64encode(half.tobytes()).decode()}


def unpacked(array: dict) -> np.ndarray:
    """``packed``'s inverse (for Python clients and the tests)."""
    data = np.frombuffer(base64.b64decode(array["data"]), dtype="<f2")
    return data.reshape(array["shape"]).astype(np.float32)
