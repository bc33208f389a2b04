"""The device resolver without a GPU: CUDA always comes back with an index (``torch.cuda.set_device`` raises
for a bare ``cuda``, which crashed every single-GPU run), and a bad name is an error that names it."""

import os

import pytest
import torch
from helpers import cpu_with

from transformer.core.config import PRECISIONS
from transformer.runtime.precision import (
    DeviceError,
    autocast_dtype,
    faster_precision,
    resolve_device,
    slow_precision,
    training_precision,
)
from transformer.training.ranks import Runtime, setup_runtime


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.parametrize("name", ["auto", "cuda"])
@pytest.mark.parametrize("local_rank", [0, 3])
def test_auto_and_cuda_resolve_to_this_process_gpu(fake_cuda, name, local_rank):
    device = resolve_device(name, local_rank)
    assert device == torch.device("cuda", local_rank) and device.index == local_rank


def test_an_explicit_index_is_kept(fake_cuda):
    assert resolve_device("cuda:1", local_rank=0) == torch.device("cuda", 1)


def test_without_cuda_auto_is_the_cpu_and_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu", local_rank=2) == torch.device("cpu")
    with pytest.raises(DeviceError, match="device cuda: CUDA is not available"):
        resolve_device("cuda")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "tpu0"])
def test_a_bad_name_is_an_error_naming_it(fake_cuda, name):
    with pytest.raises(DeviceError, match=f"device {name}: not a device name"):
        resolve_device(name)


def test_set_device_accepts_what_resolve_device_returns(fake_cuda):
    """The defect itself: torch.cuda.set_device refuses a bare 'cuda' before it looks for a GPU; the resolved
    device passes that check (on a CPU build it then fails only for want of CUDA)."""
    with pytest.raises(ValueError, match="index"):
        torch.cuda.set_device(torch.device("cuda"))
    try:
        torch.cuda.set_device(resolve_device("auto"))
    except ValueError as error:
        pytest.fail(f"set_device refused the resolved device: {error}")
    except (AttributeError, RuntimeError, AssertionError):
        pass  # no CUDA in this build


def test_bf16_and_int8_are_named_slow_only_on_a_cpu_without_their_instructions(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    cpu_with(monkeypatch)  # an AVX2 CPU: neither
    assert "no bf16 matrix instructions" in slow_precision("bf16", cpu)
    assert "no int8 dot-product instructions" in slow_precision("int8", cpu)
    assert "no bf16 matrix instructions" in slow_precision("int8-bf16", cpu)  # the rest of its model is bf16
    assert slow_precision("fp32", cpu) is None and slow_precision("auto", cpu) is None
    assert slow_precision("bf16", cuda) is None  # a GPU's bf16 is its own business
    cpu_with(monkeypatch, "avx512_bf16", "vnni")
    assert slow_precision("bf16", cpu) is None and slow_precision("int8", cpu) is None
    cpu_with(monkeypatch, "amx_tile")  # AMX multiplies both
    assert slow_precision("bf16", cpu) is None and slow_precision("int8", cpu) is None
    cpu_with(monkeypatch, "vnni")
    assert slow_precision("bf16", cpu) is not None and slow_precision("int8", cpu) is None
    assert slow_precision("int8-bf16", cpu) is not None
    cpu_with(monkeypatch, "avx512_bf16")  # bf16 without int8 dot products
    assert "no int8 dot-product instructions" in slow_precision("int8-bf16", cpu)
    cpu_with(monkeypatch, "avx512_bf16", "vnni")
    assert slow_precision("int8-bf16", cpu) is None


def test_int8_is_named_slower_than_bf16_only_on_a_cpu_with_amx(monkeypatch):
    cpu = torch.device("cpu")
    cpu_with(monkeypatch, "amx_tile")
    for precision in ("int8", "int8-bf16"):
        assert "--precision bf16 decodes faster" in faster_precision(precision, cpu)
    assert faster_precision("bf16", cpu) is None and faster_precision("fp32", cpu) is None
    assert faster_precision("int8", torch.device("cuda", 0)) is None
    for features in (("avx512_bf16", "vnni"), ("vnni",)):  # bf16 and int8 level there; int8 the fastest
        cpu_with(monkeypatch, *features)
        assert faster_precision("int8", cpu) is None
    for name in ("avx512_bf16", "amx_tile", "vnni"):  # a PyTorch that cannot say: no claim on a guess
        monkeypatch.delattr(torch.cpu, f"_is_{name}_supported", raising=False)
    assert faster_precision("int8", cpu) is None


def test_a_pytorch_that_cannot_say_gets_no_warning(monkeypatch):
    for name in ("avx512_bf16", "amx_tile", "vnni"):
        monkeypatch.delattr(torch.cpu, f"_is_{name}_supported", raising=False)
    assert slow_precision("bf16", torch.device("cpu")) is None


def test_bf16_on_the_cpu_enlarges_onednns_kernel_cache_and_keeps_a_users_value(monkeypatch, onednn_env):
    """bf16 training on the CPU compiles a oneDNN kernel per matmul shape; the cache must hold an epoch's."""
    setup_runtime("cpu", "fp32")  # fp32 matmuls do not use it: left alone
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
    assert setup_runtime("cpu", "bf16").dtype == torch.bfloat16
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16384"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    setup_runtime("cpu", "bf16")
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        ((), "fp32"),
        (("vnni",), "fp32"),
        (("avx512_bf16",), "bf16"),
        (("amx_tile",), "bf16"),
        (("avx512_bf16", "amx_tile", "vnni"), "bf16"),
    ],
)
def test_auto_trains_in_bf16_only_on_a_cpu_with_its_instructions(monkeypatch, onednn_env, features, expected):
    cpu_with(monkeypatch, *features)
    cpu = torch.device("cpu")
    assert training_precision("auto", cpu) == expected
    assert slow_precision(training_precision("auto", cpu), cpu) is None  # never a slow choice
    runtime = setup_runtime("cpu", "auto")
    assert runtime.precision == expected
    assert runtime.dtype is {"bf16": torch.bfloat16, "fp32": None}[expected]
    # bf16 brings the oneDNN kernel cache that makes it fast (test_bf16_on_the_cpu_enlarges_...)
    assert os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY") == ("16384" if expected == "bf16" else None)
    assert autocast_dtype("auto", cpu) is None  # decoding's "auto" stays fp32 on the CPU
    assert training_precision("auto", torch.device("cuda", 0)) == "bf16"


def test_ranks_that_resolve_auto_differently_are_refused(monkeypatch, onednn_env):
    """torchrun over machines with different CPUs: "auto" must not train in bf16 on some ranks only."""
    cpu_with(monkeypatch, "avx512_bf16")
    monkeypatch.setattr(Runtime, "gather", lambda self, obj: [obj, "fp32"])  # rank 1's machine: no bf16
    with pytest.raises(ValueError, match=r"train.precision=auto resolves differently .* \(bf16, fp32\)"):
        setup_runtime("cpu", "auto")
    monkeypatch.setattr(Runtime, "gather", lambda self, obj: [obj, obj])
    assert setup_runtime("cpu", "auto").precision == "bf16"


@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p != "auto"])
def test_a_named_training_precision_is_kept(monkeypatch, precision):
    cpu_with(monkeypatch)
    assert training_precision(precision, torch.device("cpu")) == precision
    cpu_with(monkeypatch, "avx512_bf16")
    assert training_precision(precision, torch.device("cpu")) == precision


def test_a_pytorch_that_cannot_say_trains_auto_in_fp32(monkeypatch):
    """No bf16 on a guess: emulated bf16 trains several times slower than fp32."""
    for name in ("avx512_bf16", "amx_tile", "vnni"):
        monkeypatch.delattr(torch.cpu, f"_is_{name}_supported", raising=False)
    assert training_precision("auto", torch.device("cpu")) == "fp32"
