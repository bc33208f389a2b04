"""Dynamic batching: one worker thread owns the ``Translator`` and decodes what the requests queued together.

    request threads / event loop          worker thread (built the Translator, decodes)
    submit(job) -> Future  ──queue──▶     wait for a first job; when callers are many, gather more
      (QueueFull past max_queue texts)    while they come (each within ``max_wait_ms`` of the last) or
                                          until ``max_tokens`` source tokens; group the jobs by their
    await the Future       ◀──results──   decoding options; decode each group (answers.py); each job
                                          gets its own lines back, in order, or its own error

The ``Translator`` is built in the worker thread, the one that decodes: PyTorch's CPU thread pool is then
used from one thread only (``Translator._check_thread`` explains why that matters).

What the service promises its callers, and where it is kept:
  - a lone caller is never kept waiting for company: a batch gathers only when the last batch held more
    than one job, or more jobs are already queued (``_gather``);
  - the queue holds at most ``max_queue`` texts; ``submit`` refuses more at once (``QueueFull``);
  - a job whose caller went away (its Future cancelled) is dropped before it is decoded: each group is
    decoded in parts of about one decoding batch, and each part starts only with the jobs still wanted;
  - a job that fails fails alone (``answers.answer_group``);
  - nothing is kept per batch: memory does not grow with the life of the process.
"""

import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from transformer.inference.translator import Translator
from transformer.serving.answers import answer_group


@dataclass
class Job:
    """One request's texts and decoding options; ``future`` receives its answers (one per text)."""

    texts: list[str]
    beam: int
    nbest: int = 1
    with_scores: bool = False
    alignments: bool = False
    attention: bool = False
    prefixes: list[str] | None = None  # per text, target text its translation starts with ("" = none)
    target_lang: str | None = None  # the language to translate into (a multilingual model's)
    constraints: list[list[str]] | None = None  # per text, target phrases its translation holds ([] = none)
    future: Future = field(default_factory=Future)
    units: int = 0  # what it counts in Batcher.queued: its texts while queued, 1 once withdrawn, 0 once taken

    @property
    def group(self) -> tuple:
        """Jobs with the same key are decoded in one call."""
        return self.beam, self.nbest, self.with_scores


class QueueFull(Exception):
    """The queue holds ``max_queue`` texts already; ``retry_after``: seconds until it has likely drained."""

    def __init__(self, queued: int, max_queue: int, retry_after: int):
        super().__init__(
            f"busy: {queued} texts are queued, the limit is {max_queue}; retry in {retry_after} s"
        )
        self.retry_after = retry_after


RETRY_AFTER_MAX = 5  # seconds: the queue drains faster than the last batch's pace when its callers hang up
WAITS = 4  # a batch that keeps growing closes after this many max_wait at most, or after
GATHER_SHARE = 0.5  # this share of the time the last batch took to decode, if that is longer: under load
# the callers of the last batch are sending their next requests while this one gathers, and one batch of
# twice the sentences decodes in much less than twice the time (docs/benchmarks.md, "Serving under load")


PART_SHARE = 0.5  # a group is decoded in parts of this share of eval.max_tokens source tokens, over the beam
# size: about one of the Translator's own batches (which count the source and as many again for the output,
# for each hypothesis), so a part costs no batching, and the jobs of callers who hang up meanwhile are
# dropped before the next part


class Batcher:
    """The worker thread and its queue. ``start`` builds the translator in the worker (``make``: a function
    that returns it) and waits until it is ready; ``stop`` lets the queued jobs finish, then ends it."""

    def __init__(
        self, make: Callable[[], Translator], max_wait_ms: float = 25.0, max_tokens: int = 8000,
        max_queue: int = 512,
    ):  # fmt: skip
        self.make, self.max_wait, self.max_tokens = make, max_wait_ms / 1000.0, max_tokens
        self.max_queue = max_queue
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.queued, self.lock = 0, threading.Lock()  # texts in the queue, not yet taken by the worker
        self.translator: Translator | None = None
        self.ready, self.failed = threading.Event(), None
        self.thread = threading.Thread(target=self._run, name="translator", daemon=True)
        self.last_batch = 0  # jobs in the last batch: more than one means callers are many
        self.last_decode = 0.0  # seconds the last batch took to decode
        self.texts_per_second = 0.0  # of the last batch (Retry-After's estimate)
        self.batches = 0  # batches decoded so far

    def start(self) -> Translator:
        self.thread.start()
        self.ready.wait()
        if self.failed is not None:
            raise self.failed
        return self.translator

    def submit(self, job: Job) -> Future:
        """Queue ``job``; QueueFull if the queue would then hold more than ``max_queue`` texts."""
        with self.lock:
            if self.queued + len(job.texts) > self.max_queue:
                raise QueueFull(self.queued, self.max_queue, self._retry_after())
            self.queued += len(job.texts)
            job.units = len(job.texts)
        self.jobs.put(job)
        return job.future

    def withdraw(self, job: Job) -> None:
        """Its caller went away: drop ``job`` unless the worker has started it, and free its queue room now
        (not when the worker reaches it) but one unit, so the queue never holds more than ``max_queue``
        entries, dead or alive; its texts are let go at once."""
        with self.lock:
            if job.future.cancel() and job.units:
                self.queued -= job.units - 1
                job.units, job.texts, job.prefixes, job.constraints = 1, [], None, None

    def _retry_after(self) -> int:
        """Seconds until the queue has likely drained at the last batch's pace, 1 to ``RETRY_AFTER_MAX``."""
        if self.texts_per_second <= 0:
            return 1
        return min(RETRY_AFTER_MAX, max(1, math.ceil(self.queued / self.texts_per_second)))

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
            decoded = self._decode(batch)
            self.last_decode = time.monotonic() - start
            self.last_batch, self.batches = len(batch), self.batches + 1
            if decoded:
                self.texts_per_second = decoded / max(self.last_decode, 1e-3)

    def _take(self, timeout: float | None = None) -> Job | None:
        """The next job whose caller is still there (None: stop); queue.Empty after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            job = self.jobs.get(timeout=left) if left != 0.0 else self.jobs.get_nowait()
            if job is None:
                return None
            with self.lock:
                self.queued -= job.units
                job.units = 0
            if not job.future.cancelled():
                return job

    def _gather(self) -> list[Job] | None:
        """The next batch: a first job, then, when callers are many, more for as long as they keep coming,
        each within ``max_wait`` of the last (in all at most ``WAITS`` times ``max_wait``, or
        ``GATHER_SHARE`` of the last batch's decoding time if longer), while the source tokens stay under
        ``max_tokens`` (counted as characters / 4, before tokenizing). None: stop."""
        first = self._take()
        if first is None:
            return None
        if self.last_batch <= 1 and self.jobs.empty():  # a lone caller: decode at once
            return [first]
        window = max(WAITS * self.max_wait, GATHER_SHARE * self.last_decode)
        batch, size, deadline = [first], _size(first), time.monotonic() + window
        while size < self.max_tokens and (left := min(self.max_wait, deadline - time.monotonic())) > 0:
            try:
                job = self._take(timeout=left)
            except queue.Empty:
                break
            if job is None:  # stop after this batch
                self.jobs.put(None)
                break
            batch.append(job)
            size += _size(job)
        return batch

    def _decode(self, batch: list[Job]) -> int:
        """Answer every job of ``batch`` still wanted, the smallest group first (a lone sentence is not
        kept behind a large request); the number of texts decoded."""
        groups: dict[tuple, list[Job]] = {}
        for job in batch:
            groups.setdefault(job.group, []).append(job)
        decoded, max_tokens = 0, self.translator.settings.max_tokens
        for (beam, *_), jobs in sorted(groups.items(), key=lambda item: sum(_size(job) for job in item[1])):
            for part in _parts(jobs, max(1, int(PART_SHARE * max_tokens / beam))):
                live = [job for job in part if job.future.set_running_or_notify_cancel()]  # callers there
                for job, answer in zip(live, answer_group(self.translator, live)):
                    _deliver(job, answer)
                decoded += sum(len(job.texts) for job in live)
        return decoded


def _parts(jobs: list[Job], tokens: int) -> list[list[Job]]:
    """``jobs`` in consecutive parts of about ``tokens`` source tokens each (a job is never split)."""
    parts, size = [[]], 0
    for job in jobs:
        if parts[-1] and size + _size(job) > tokens:
            parts.append([])
            size = 0
        parts[-1].append(job)
        size += _size(job)
    return parts


def _deliver(job: Job, answer: list | Exception) -> None:
    try:
        if isinstance(answer, Exception):
            job.future.set_exception(answer)
        else:
            job.future.set_result(answer)
    except InvalidStateError:  # cancelled meanwhile: nobody waits for it
        pass


def _size(job: Job) -> int:
    return sum(len(text) for text in job.texts) // 4 + len(job.texts)
