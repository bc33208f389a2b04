"""runtime/memory.py: with ``keep_freed_memory``, a large block comes from malloc's heap, not from pages
mapped for it alone, and stays in the heap once freed; the user's own malloc settings and a GPU are left
alone."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, random_model

from transformer.runtime import memory
from transformer.runtime.precision import decoding_model

# In a process of its own (the setting is the process's, for good), from glibc's own accounts (mallinfo2):
# the MB a 64 MB tensor holds in blocks mapped apart from the heap, then the MB free in the heap once it is
# freed; before the call and after it.
HEAP_ACCOUNTS = """
import ctypes, torch
from transformer.runtime.memory import keep_freed_memory

class Info(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info

def mapped_then_kept():
    block = torch.ones(16 << 20)  # 64 MB
    mapped = libc.mallinfo2().hblkhd >> 20
    del block
    return mapped, libc.mallinfo2().fordblks >> 20

print(*mapped_then_kept(), keep_freed_memory(torch.device("cpu")), *mapped_then_kept())
"""


@pytest.fixture
def unset(monkeypatch):
    """keep_freed_memory not yet called in this process, and no malloc setting of the user's."""
    monkeypatch.setattr(memory, "_applied", None)
    for name in memory.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)


def test_a_large_block_comes_from_the_heap_and_stays_there_once_freed(unset):
    env = {name: value for name, value in os.environ.items() if name not in memory.USER_SETTINGS}
    done = subprocess.run([sys.executable, "-c", HEAP_ACCOUNTS], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    mapped_before, kept_before, applied, mapped, kept = done.stdout.split()
    assert applied == "True"
    assert int(mapped_before) >= 64 and int(kept_before) < 64  # glibc's default: mapped, given back
    assert int(mapped) < 64 and int(kept) >= 64  # from the heap, and kept there for the next step


def test_both_thresholds_go_to_mallopt(unset, monkeypatch):
    """The trim threshold is what keeps a freed block at the heap's top (the test above cannot place one
    there): glibc's malloc.h numbers, M_MMAP_THRESHOLD -3 and M_TRIM_THRESHOLD -1."""
    calls = []

    class Libc:
        def mallopt(self, parameter: int, value: int) -> int:
            calls.append((parameter, value))
            return 1

    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: Libc())
    assert memory.keep_freed_memory(torch.device("cpu")) is True
    assert calls == [(-3, 1 << 30), (-1, (1 << 31) - 1)]


def test_the_users_malloc_settings_and_a_gpu_are_left_alone(unset, monkeypatch):
    assert memory.keep_freed_memory(torch.device("cuda", 0)) is False and memory._applied is None
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert memory.keep_freed_memory(torch.device("cpu")) is False and memory._applied is False


def test_decoding_on_the_cpu_keeps_freed_memory(unset):
    decoding_model(random_model(0), "fp32", torch.device("cpu"))
    assert memory._applied is True
