"""Where and in what precision a job computes: the device (THE device resolver of the project), the
autocast precision, the precision training picks, and the copy of a model that decoding runs.

Why bf16 is the training default on CPUs with bf16 matrix instructions, and why oneDNN's kernel cache is
enlarged: docs/benchmarks.md, "Precision on the CPU".
"""

import contextlib
import copy
import os

import torch

from transformer.core.config import PRECISIONS
from transformer.core.model import Transformer
from transformer.runtime.memory import keep_freed_memory

QUANTIZED_PRECISIONS = ("int8", "int8-bf16")  # decoding only: int8 linear layers on the CPU (quantize.py)
DECODE_PRECISIONS = PRECISIONS + QUANTIZED_PRECISIONS  # translate.py --precision


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

    On such CPUs bf16 autocast (fp32 master weights and Adam state) trains faster than fp32 for more memory,
    and validates no worse (docs/benchmarks.md, "Precision on the CPU"); elsewhere bf16 runs emulated,
    several times slower. A run keeps what it started in: ``--resume`` on a machine that resolves "auto"
    otherwise is refused. Decoding's "auto" (``autocast_dtype``) stays fp32 on the CPU: there bf16 gains
    only after oneDNN has compiled a kernel for every new shape.
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
    in emulated bf16; int8 products (int8 and int8-bf16) without VNNI or AMX run on older instructions
    (docs/benchmarks.md, "Precision on the CPU").
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
            "instructions, with one bit less, many times slower than fp32; use fp32"
        )
    return None


def faster_precision(precision: str, device: torch.device) -> str | None:
    """Why another precision decodes faster than ``precision`` on this CPU, or None when none is known to:
    int8 products pay a fixed cost per call (quantizing the input) that AMX's bf16 products do not, and on
    the CPU with AMX measured bf16 decoded 1.4x as fast as int8; with AVX512-BF16 alone the two were level
    (docs/benchmarks.md, "Decoding speed against transformers and CTranslate2")."""
    has_amx = _cpu_has("amx_tile", unknown=False)  # no claim on a guess
    if device.type != "cpu" or precision not in ("int8", "int8-bf16") or not has_amx:
        return None
    return (
        "this CPU multiplies bf16 matrices with AMX, where --precision bf16 decodes faster than int8 and "
        "int8-bf16 (docs/benchmarks.md)"
    )


ONEDNN_CACHE_CAPACITY = 16384  # oneDNN's default is 1024


def size_onednn_cache(device: torch.device, dtype: torch.dtype | None) -> None:
    """Let oneDNN keep 16384 compiled kernels instead of 1024, for bf16 (training and decoding) and int8
    (decoding, ``quantize.py``) products on the CPU; before the first matmul.

    bf16 and int8 matmuls on the CPU go through oneDNN, which compiles a kernel (a "primitive") for every
    shape and keeps the last ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``. A Multi30k epoch's batches come in ~170
    shapes (the same every epoch), each with ~50 forward and backward matmuls: ~8000 kernels. 1024 do not
    hold them, and every step would compile its kernels again (docs/benchmarks.md, "oneDNN's kernel
    cache"). The variable is read at oneDNN's first primitive, so this
    must run before any bf16 matmul; a value the user set is kept. fp32 matmuls do not use this cache.
    Decoding multiplies a new number of rows at most steps (sentences finish): as many kernels per shape.
    """
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.int8):
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE_CAPACITY))


def autocast(device: torch.device, dtype: torch.dtype | None):
    """THE autocast context of the project: none for fp32 (dtype None), else ``torch.autocast``."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def decoding_model(
    model: Transformer, precision: str, device: torch.device
) -> tuple[Transformer, torch.dtype | None]:
    """The model to decode with for ``precision`` ("auto", "fp32", "bf16", "fp16") and its autocast dtype
    (None: none). On the CPU, bf16 decodes a bf16 copy of the model without autocast (``model`` is left as
    it is): no weight or input is cast at each call. Elsewhere: ``model`` under autocast. Scores stay fp32
    in every precision (``core/decoding.py``). oneDNN's kernel cache is sized first, and on the CPU freed
    memory is kept for the next step (``runtime/memory.py``)."""
    keep_freed_memory(device)
    if precision == "bf16" and device.type == "cpu":
        size_onednn_cache(device, torch.bfloat16)
        return copy.deepcopy(model).to(torch.bfloat16), None
    dtype = autocast_dtype(precision, device)  # None = fp32
    size_onednn_cache(device, dtype)
    return model, dtype
