"""runtime/memory.py: with ``keep_freed_memory``, a large block freed and asked for again comes back without
the system paging it in anew; the user's own malloc settings and a GPU are left alone."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, random_model

from transformer.runtime import memory
from transformer.runtime.precision import decoding_model

# In a process of its own (the setting is the process's, for good): the minor page faults of filling a
# 64 MB tensor (16384 pages of 4 KB) three times, each freed before the next, before the call and after it
# (after four fills more: the heap grows by a few such blocks before each request finds a freed one).
PAGE_FAULTS = """
import resource, sys, torch
from transformer.runtime.memory import keep_freed_memory

def faults_of_fills(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        torch.ones(16 << 20).sum()  # 64 MB, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults_of_fills(3)
applied = keep_freed_memory(torch.device("cpu"))
faults_of_fills(4)
print(default, applied, faults_of_fills(3))
"""


@pytest.fixture
def unset(monkeypatch):
    """keep_freed_memory not yet called in this process, and no malloc setting of the user's."""
    monkeypatch.setattr(memory, "_applied", None)
    for name in memory.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)


def test_a_freed_block_is_not_paged_in_again(unset):
    env = {name: value for name, value in os.environ.items() if name not in memory.USER_SETTINGS}
    done = subprocess.run([sys.executable, "-c", PAGE_FAULTS], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    default, applied, kept = done.stdout.split()
    assert applied == "True"
    assert int(default) > 45000  # glibc's default: 64 MB is above its largest mmap threshold, paged in anew
    assert int(kept) < 1000  # freed blocks served again from the heap


def test_the_users_malloc_settings_and_a_gpu_are_left_alone(unset, monkeypatch):
    assert memory.keep_freed_memory(torch.device("cuda", 0)) is False and memory._applied is None
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert memory.keep_freed_memory(torch.device("cpu")) is False and memory._applied is False


def test_decoding_on_the_cpu_keeps_freed_memory(unset):
    decoding_model(random_model(0), "fp32", torch.device("cpu"))
    assert memory._applied is True
