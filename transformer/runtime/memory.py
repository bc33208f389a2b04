"""Large tensors kept by the allocator between steps, on Linux with glibc (the CPU's memory).

A training step allocates the same large tensors every time (activations, the fast tier's (tokens, V)
gradient of the logits under bf16, the plain core's whole logits), and so does each decoding step (the
(rows, V) logits). glibc's ``malloc`` serves a block above its mmap threshold (128 KB, raised as such blocks
are freed, up to 32 MB) from fresh pages of the system, and gives it back when it is freed; the next step
then touches every page anew, each a page fault, and a block above 32 MB always so. ``keep_freed_memory``
serves blocks up to 1 GB from malloc's own heap and keeps up to 2 GB of freed memory there for the next
step, as jemalloc or tcmalloc (``LD_PRELOAD``) would. The process keeps its peak memory instead of returning
it between steps (the heap grows by a few of the largest blocks before each request finds a freed one).
Nothing is computed differently. Any of malloc's variables set by the user turns it off (e.g.
``MALLOC_TRIM_THRESHOLD_=131072``, glibc's initial value). Speeds: docs/benchmarks.md, "Speed choices in the
code".
"""

import ctypes
import os
import sys

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GB from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # keep up to 2 GB of freed memory (mallopt takes an int)
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")  # the user's, kept

_applied: bool | None = None


def keep_freed_memory(device: torch.device) -> bool:
    """For a ``device`` that is the CPU: set glibc's mmap and trim thresholds for this process (module
    docstring), once; whether they are set. Not on other systems or C libraries, nor where the user set
    malloc's variables (``USER_SETTINGS``)."""
    global _applied
    if _applied is None and device.type == "cpu":
        _applied = False
        if sys.platform.startswith("linux") and not any(os.environ.get(name) for name in USER_SETTINGS):
            mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's; musl has none
            if mallopt is not None:
                _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                )
    return bool(_applied)
