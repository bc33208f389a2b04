"""Dynamic batching: one worker thread owns the ``Translator`` and decodes what the requests queued together.

    request threads / event loop          worker thread (built the Translator, decodes)
    submit(job) -> Future  ──queue──▶     wait for a first job, then gather more while they come
                                          (each within ``max_wait_ms`` of the last) or until
                                          ``max_tokens`` source tokens; group the jobs by their
    await the Future       ◀──results──   decoding options; one translate_ids call per group; each job
                                          gets its own lines back, in order

The ``Translator`` is built in the worker thread, the one that decodes: PyTorch's CPU thread pool is then
used from one thread only (``Translator._check_thread`` explains why that matters). A job whose caller went
away (its Future cancelled) is dropped before decoding, and cannot disturb the others' results.
"""

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from transformer.inference.alignment import pharaoh
from transformer.inference.translator import Translator


@dataclass
class Job:
    """One request's texts and decoding options; ``future`` receives its answers (one per text)."""

    texts: list[str]
    beam: int
    nbest: int
    with_scores: bool
    alignments: bool
    attention: bool
    prefix: list[str] | None
    future: Future = field(default_factory=Future)

    @property
    def group(self) -> tuple:
        """Jobs with the same key are decoded in one call."""
        return self.beam, self.nbest, self.with_scores


WAITS = 4  # a batch that keeps growing closes after this many max_wait at most, or after
GATHER_SHARE = 0.5  # this share of the time the last batch took to decode, if that is longer: under load
# the callers of the last batch are sending their next requests while this one gathers, and one batch of
# twice the sentences decodes in much less than twice the time (docs/benchmarks.md, "Serving under load")


class Batcher:
    """The worker thread and its queue. ``start`` builds the translator in the worker (``make``: a function
    that returns it) and waits until it is ready; ``stop`` lets the queued jobs finish, then ends it."""

    def __init__(self, make: Callable[[], Translator], max_wait_ms: float = 25.0, max_tokens: int = 8000):
        self.make, self.max_wait, self.max_tokens = make, max_wait_ms / 1000.0, max_tokens
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.translator: Translator | None = None
        self.ready, self.failed = threading.Event(), None
        self.thread = threading.Thread(target=self._run, name="translator", daemon=True)
        self.batches: list[int] = []  # jobs per decoded batch (for tests and the benchmark)
        self.last_decode = 0.0  # seconds the last batch took to decode

    def start(self) -> Translator:
        self.thread.start()
        self.ready.wait()
        if self.failed is not None:
            raise self.failed
        return self.translator

    def submit(self, job: Job) -> Future:
        self.jobs.put(job)
        return job.future

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _run(self) -> None:
        try:
            self.translator = self.make()
        except BaseException as error:  # handed to start(), raised there
            self.failed = error
            return
        finally:
            self.ready.set()
        while (batch := self._gather()) is not None:
            start = time.monotonic()
            self._decode(batch)
            self.last_decode = time.monotonic() - start

    def _gather(self) -> list[Job] | None:
        """The next batch: a first job, then more for as long as they keep coming, each within ``max_wait``
        of the last (in all at most ``WAITS`` times ``max_wait``, or ``GATHER_SHARE`` of the last batch's
        decoding time if longer), while the source tokens stay under
        ``max_tokens`` (counted as characters / 4, before tokenizing). None: stop."""
        first = self.jobs.get()
        if first is None:
            return None
        window = max(WAITS * self.max_wait, GATHER_SHARE * self.last_decode)
        batch, size, deadline = [first], _size(first), time.monotonic() + window
        while size < self.max_tokens and (left := min(self.max_wait, deadline - time.monotonic())) > 0:
            try:
                job = self.jobs.get(timeout=left)
            except queue.Empty:
                break
            if job is None:  # stop after this batch
                self.jobs.put(None)
                break
            batch.append(job)
            size += _size(job)
        return batch

    def _decode(self, batch: list[Job]) -> None:
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]  # callers still there
        self.batches.append(len(live))
        groups: dict[tuple, list[Job]] = {}
        for job in live:
            groups.setdefault(job.group, []).append(job)
        for jobs in groups.values():
            try:
                answers = answer_jobs(self.translator, jobs)
            except Exception as error:  # noqa: BLE001 -- each caller gets the error of its group
                answers = [error] * len(jobs)
            for job, answer in zip(jobs, answers):
                try:
                    if isinstance(answer, Exception):
                        job.future.set_exception(answer)
                    else:
                        job.future.set_result(answer)
                except InvalidStateError:  # cancelled meanwhile: nobody waits for it
                    pass


def _size(job: Job) -> int:
    return sum(len(text) for text in job.texts) // 4 + len(job.texts)


def answer_jobs(translator: Translator, jobs: list[Job]) -> list[list]:
    """Decode the texts of jobs with the same options in one call; per job, one answer per text."""
    beam, nbest, with_scores = jobs[0].group
    texts = [text for job in jobs for text in job.texts]
    prefixes = None
    if any(job.prefix for job in jobs):
        prefix_texts = [p for job in jobs for p in (job.prefix or [""] * len(job.texts))]
        prefixes = translator.encode_targets(prefix_texts, "prefix {n}")
    sources = translator.encode(texts, "text {n}")
    found = translator.translate_ids(sources, beam, nbest if nbest > 1 else None, with_scores, prefixes)
    answers, start = [], 0
    for job in jobs:
        rows = range(start, start + len(job.texts))
        answers.append([answer(translator, job, sources[i], found[i]) for i in rows])
        start += len(job.texts)
    return answers


def answer(translator: Translator, job: Job, source: list[int] | None, hyps) -> dict | list[dict]:
    """One text's answer: its translation (``nbest`` > 1: a list of them, best first) with what was asked."""
    entries = []
    for rank, hyp in enumerate(hyps):
        entry = {"text": translator.decode(hyp.ids)}
        if job.with_scores or job.nbest > 1:
            entry["score"] = hyp.log_prob
        if rank == 0 and (job.alignments or job.attention) and source is not None:
            attention = translator.attention_ids(source, hyp.ids, hyp.ended)
            if job.alignments:
                entry["alignment"] = pharaoh(translator.alignments_of(attention))
            if job.attention:
                entry["attention"] = {
                    "source_pieces": attention.source_pieces,
                    "target_pieces": attention.target_pieces,
                    "cross": [
                        [[[round(x, 5) for x in row] for row in head] for head in layer.tolist()]
                        for layer in attention.cross
                    ],  # fmt: skip  # [layer][head][target][source]
                }
        entries.append(entry)
    return entries if job.nbest > 1 else entries[0]
