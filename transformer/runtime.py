"""Where a job runs: the device (THE device resolver of the project), the autocast precision, and, under
``torchrun``, this process's rank in the process group.
"""

import contextlib
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from transformer.config import PRECISIONS


class DeviceError(ValueError):
    """A device name that cannot be used here; the message names it."""


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' (CUDA when present), 'cpu', 'cuda', 'cuda:1', ... -> a device, CUDA always with an index.

    A bare 'cuda' means this process's GPU, ``cuda:{local_rank}``: ``torch.cuda.set_device`` and the
    process group need the index.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"device {name}: not a device name (auto, cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {name}: CUDA is not available here")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """'auto' | 'fp32' | 'bf16' | 'fp16' -> the autocast dtype (None = fp32). Decoding's 'auto' is bf16 on
    CUDA, fp32 on the CPU; training resolves 'auto' first (``training_precision``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def training_precision(precision: str, device: torch.device) -> str:
    """The precision training runs in: "auto" is bf16 on CUDA and on a CPU with bf16 matrix instructions
    (AVX512-BF16 or AMX), else fp32; any other name is kept.

    On such CPUs bf16 autocast (fp32 master weights and Adam state) trained the default model 1.4-1.7x
    faster than fp32 on Intel Xeons with AMX and an AMD EPYC with AVX512-BF16 only, for more memory
    (oneDNN keeps a compiled kernel per matmul shape), and on Multi30k it validated higher than fp32 in
    every seed measured (docs/benchmarks.md). Elsewhere bf16 runs emulated, several times slower. A run
    keeps what it started in: ``--resume`` on a machine that resolves "auto" otherwise is refused.
    Decoding's "auto" (``autocast_dtype``) stays fp32 on the CPU: there bf16 gains only after oneDNN has
    compiled a kernel for every new shape.
    """
    if precision != "auto":
        return precision
    fast_bf16 = device.type == "cuda" or (device.type == "cpu" and _cpu_has_bf16(unknown=False))
    return "bf16" if fast_bf16 else "fp32"


def _cpu_has_bf16(unknown: bool = True) -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX); ``unknown`` where this
    PyTorch cannot say."""
    return _cpu_has("avx512_bf16", unknown) or _cpu_has("amx_tile", unknown)


def _cpu_has(feature: str, unknown: bool = True) -> bool:
    """Whether this CPU has an instruction set PyTorch reports (``torch.cpu._is_<feature>_supported``);
    ``unknown`` when this PyTorch cannot say: True for warnings (none given on a guess), False for choices."""
    check = getattr(torch.cpu, f"_is_{feature}_supported", None)
    return unknown if check is None else bool(check())


def slow_precision(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` ("bf16", "int8", ...) runs SLOWER than fp32 on this CPU, or None when it need not.

    bf16 (autocast, a bf16 copy, or the rest of int8-bf16's model) on a CPU without AVX512-BF16 or AMX runs
    in emulated bf16; int8 products (int8 and int8-bf16) without VNNI or AMX run on older instructions. On
    a 2-core AVX2 CPU (docs/benchmarks.md) greedy decoding ran at 0.18x fp32's speed in bf16 and 0.07x in
    int8 (torchao's layer of then), a 256-1024 int8 matmul at 1/46.
    """
    if device.type != "cpu":
        return None
    if precision in ("bf16", "int8-bf16") and not _cpu_has_bf16():
        return (
            "this CPU has no bf16 matrix instructions (AVX512-BF16 or AMX): bf16 runs emulated, several "
            "times slower than fp32 here; use fp32"
        )
    if precision in ("int8", "int8-bf16") and not (_cpu_has("vnni") or _cpu_has("amx_tile")):
        return (
            "this CPU has no int8 dot-product instructions (VNNI or AMX): int8 products run on older "
            "instructions, with one bit less, and an earlier int8 layer ran many times slower than fp32 "
            "on such a CPU; use fp32"
        )
    return None


ONEDNN_CACHE_CAPACITY = 16384  # oneDNN's default is 1024


def size_onednn_cache(device: torch.device, dtype: torch.dtype | None) -> None:
    """Let oneDNN keep 16384 compiled kernels instead of 1024, for bf16 (training and decoding) and int8
    (decoding, ``quantize.py``) products on the CPU; before the first matmul.

    bf16 and int8 matmuls on the CPU go through oneDNN, which compiles a kernel (a "primitive") for every
    shape and keeps the last ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``. A Multi30k epoch's batches come in ~170
    shapes (the same every epoch), each with ~50 forward and backward matmuls: ~8000 kernels. 1024 do not hold
    them, so every step compiled its kernels again and bf16 training ran no faster than fp32 (2.02 against
    1.95 steps a second on an Intel Xeon with AMX); with 16384, 2.72, for 5.7 GB of memory against 4.0
    (docs/benchmarks.md: oneDNN's kernel cache). The variable is read at oneDNN's first primitive, so this
    must run before any bf16 matmul; a value the user set is kept. fp32 matmuls do not use this cache.
    Decoding multiplies a new number of rows at most steps (sentences finish): as many kernels per shape.
    """
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.int8):
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE_CAPACITY))


def autocast(device: torch.device, dtype: torch.dtype | None):
    """THE autocast context of the project: none for fp32 (dtype None), else ``torch.autocast``."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None = fp32
    rank: int = 0
    world_size: int = 1
    # a CPU (gloo) group with a long timeout, for the ranks that wait while rank 0 validates
    waiting_group: object = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def max_over_ranks(self, value: int) -> int:
        """The largest ``value`` of all processes (a collective: every rank must call it)."""
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def sum_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over all processes (a collective)."""
        if self.world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def gather(self, obj: object) -> list:
        """Every process's ``obj``, in rank order (a collective)."""
        if self.world_size == 1:
            return [obj]
        objects = [None] * self.world_size
        dist.all_gather_object(objects, obj)
        return objects

    def wait_for_main(self) -> None:
        """All ranks meet here; the others may wait as long as rank 0 validates (NCCL's own timeout is
        10 minutes, so the wait goes through a CPU group with a timeout of a day)."""
        if self.world_size > 1:
            dist.barrier(group=self.waiting_group)

    def close(self) -> None:
        """Wait for every process (rank 0 may be testing: the long-timeout wait), then leave the group."""
        if self.world_size > 1:
            self.wait_for_main()
            dist.destroy_process_group()

    def autocast(self):
        return autocast(self.device, self.dtype)

    @property
    def precision(self) -> str:
        """The precision training runs in, by name ("fp32", "bf16", "fp16"): what validation decodes in."""
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]


def setup_runtime(device_name: str, precision: str) -> Runtime:
    """Device, precision, TF32, and the process group when started by ``torchrun``."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    waiting_group = None
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        waiting_group = dist.new_group(backend="gloo", timeout=timedelta(days=1))
    dtype = autocast_dtype(training_precision(precision, device), device)
    size_onednn_cache(device, dtype)
    runtime = Runtime(device, dtype, rank, world_size, waiting_group)
    if len(chosen := set(runtime.gather(runtime.precision))) > 1:  # "auto" on machines with other CPUs
        raise ValueError(f"train.precision={precision} resolves differently across the ranks' machines "
                         f"({', '.join(sorted(chosen))}): set one of them")  # fmt: skip
    return runtime
