"""Batches collated ahead of the training loop by a background thread."""

import queue
import threading
from collections.abc import Iterable, Iterator

import torch

from transformer.core.batches import Batch


def pinned(batch: Batch) -> Batch:
    """The batch in page-locked memory, from which copies to a GPU overlap with its work."""
    src, tgt_in, tgt_out = (t.pin_memory() for t in (batch.src, batch.tgt_in, batch.tgt_out))
    return Batch(src, tgt_in, tgt_out, batch.indices, batch.n_src_tokens, batch.n_tgt_tokens)


def prefetch(batches: Iterable[Batch], device: torch.device, depth: int = 2) -> Iterator[Batch]:
    """The same batches, collated ``depth`` ahead by a background thread (pinned when going to a GPU), so
    that building the next batch in Python overlaps with the device's work on this one."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    done, stop = object(), threading.Event()

    def put(item) -> None:  # gives up when the consumer has stopped (a break, an error)
        while not stop.is_set():
            try:
                return ready.put(item, timeout=0.1)
            except queue.Full:
                pass

    def produce() -> None:
        try:
            for batch in batches:
                put(pinned(batch) if device.type == "cuda" else batch)
                if stop.is_set():
                    return
        except BaseException as error:  # handed to the consumer, raised there
            put(error)
        put(done)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        while (item := ready.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        producer.join()  # no torch work left in the background when the process exits (it could abort)
