"""int8 decoding: a copy of a trained model whose linear layers multiply in int8, for ``--precision int8``
and ``--precision int8-bf16`` (CTranslate2's ``int8`` and ``int8_bfloat16``).

Every linear layer (the attention projections, the feed-forward layers and the output projection, even when
it is tied to the target embedding) becomes an ``Int8Linear``:

- its weight is stored as int8 with one scale per output channel, quantized by torchao
  (``Int8Tensor.from_hp``, symmetric, per row), the maintained successor of ``torch.ao.quantization``;
- at every call its input is quantized to int8 with one scale per row (per token), symmetric, as
  torchao's ``choose_qparams_affine`` / ``quantize_affine`` compute them for its dynamic int8 layers
  (``Int8DynamicActivationInt8WeightConfig``'s default; for a bf16 input, the same computed in fp32) and
  as CTranslate2's ``int8`` does: a token's int8 products do not depend on the other sentences of its
  batch, as they would with one scale per tensor;
- the int8 products are summed in int32 by oneDNN's int8 linear, on a weight laid out for it once
  (``torch.ops.onednn.qlinear_prepack`` / ``qlinear_pointwise``: the kernels that torchao's x86 Inductor
  passes lower its quantized linear layers to), and scaled back by the weight's and the row's scales. No
  matmul here is written by hand.

The two precisions differ in everything else: ``int8`` keeps the rest of the model fp32 (embeddings,
LayerNorm, softmax and the attention's own matmuls of activations by activations, Eq. 1, which have no
weights to quantize); ``int8-bf16`` makes it bf16, for CPUs with bf16 instructions. The output layer gives
fp32 logits in both, and scores (log-probabilities, beam sums) stay fp32. On a CPU without VNNI or AMX,
weights and inputs keep one bit less (torchao's ``should_reduce_range``), so that the int8 products that
such a CPU sums in 16 bits cannot overflow.

The optional extra ``pip install -e ".[int8]"`` installs torchao; the rest of the package never imports it.
Decoding only: a quantized model is never trained or saved. Speeds: docs/benchmarks.md.
"""

import copy

import torch
from torch import nn

from transformer.core.attention import MultiHeadAttention
from transformer.core.model import Transformer
from transformer.fast.attention import FastMultiHeadAttention
from transformer.fast.twins import twin
from transformer.runtime.memory import keep_freed_memory
from transformer.runtime.precision import QUANTIZED_PRECISIONS, decoding_model, size_onednn_cache
from transformer.runtime.quiet import quiet_libraries

QUANTIZED = QUANTIZED_PRECISIONS  # the decoding precisions that quantize (config.py holds the list)
INT8, INT8_BF16 = QUANTIZED  # int8 products, the rest fp32 | int8 products, the rest bf16
EPS = torch.finfo(torch.float32).eps  # torchao's smallest scale
ZERO_POINT = 128  # int8 inputs shifted into oneDNN's uint8
ZERO_POINT_TENSOR, ONE = torch.tensor(ZERO_POINT), torch.tensor(1.0)  # the shift and scale oneDNN undoes


def _torchao(precision: str):
    try:
        with quiet_libraries():  # its optional GPU kernels fail to load on a CPU, and say so
            from torchao.quantization import Int8Tensor, PerRow
            from torchao.utils import should_reduce_range
    except ImportError:
        raise ValueError(f'--precision {precision} needs torchao: pip install -e ".[int8]"') from None
    return Int8Tensor, PerRow, should_reduce_range


def has_onednn_int8() -> bool:
    """Whether this PyTorch has oneDNN's int8 linear (x86 builds do; others may not)."""
    ops = torch.ops.onednn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("qlinear_prepack", "qlinear_pointwise")
    )


def quantize_per_row(x: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, K) float -> (int8 values + 128 as uint8 (N, K), one scale per row (N, 1) fp32) for the int8
    range [-qmax - 1, qmax]: the symmetric per-row quantization of torchao's ``choose_qparams_affine`` and
    ``quantize_affine`` (scale = the row's largest magnitude / (qmax + 0.5); x times 1 / scale in fp32,
    rounded half to even, clamped). Shifted by 128 for oneDNN, whose int8 kernels take uint8 inputs and
    one zero point: 128 for every row."""
    largest = x.abs().amax(dim=-1, keepdim=True).float()  # (N, 1) exact in x's dtype
    scale = (largest / (qmax + 0.5)).clamp_min_(EPS)  # (N, 1)
    scaled = x * (1.0 / scale)  # (N, K) fp32 products even for a bf16 x (a dimensioned fp32 factor)
    values = scaled.round_().clamp_(-qmax - 1, qmax).to(torch.int8)  # (N, K) v in [-qmax - 1, qmax]
    # v's bits read as uint8, plus 128 modulo 256, are v + 128: the shift made in 1-byte numbers
    return values.view(torch.uint8).add_(ZERO_POINT), scale


class Int8Linear(nn.Module):
    """``F.linear(x, weight, bias)`` in int8 (see the module docstring): x (..., in) -> (..., out) in
    ``out_dtype``. Holds the int8 weight (as it is, and in oneDNN's layout), its scales and an fp32 bias;
    ``quantize`` makes one from a float layer, ``rows`` one of some of its output rows."""

    def __init__(
        self, weight_int8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
        out_dtype: torch.dtype, input_max: int,
    ):  # fmt: skip
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.weight_int8, self.weight_scale = weight_int8, weight_scale  # (out, in) int8, (out,) fp32
        self.bias = bias  # (out,) fp32, or None
        self.weight_zero_point = torch.zeros(self.out_features, dtype=torch.int64)  # (out,) symmetric
        self.packed = torch.ops.onednn.qlinear_prepack(weight_int8, None)  # oneDNN's layout, once
        self.out_dtype, self.input_max = out_dtype, input_max

    @classmethod
    def quantize(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype, precision: str
    ) -> "Int8Linear":  # fmt: skip
        """The layer of float ``weight`` (out, in) and ``bias`` (out,), quantized by torchao (module
        docstring); on a CPU without VNNI or AMX with one bit less (``should_reduce_range``)."""
        Int8Tensor, PerRow, should_reduce_range = _torchao(precision)
        reduce = should_reduce_range(torch.device("cpu"))
        quantized = Int8Tensor.from_hp(weight.detach().float().cpu(), PerRow(), reduce_range=reduce)
        scale = quantized.scale.flatten().float()  # (out,)
        bias = None if bias is None else bias.detach().float().cpu()  # (out,)
        return cls(quantized.qdata, scale, bias, out_dtype, 63 if reduce else 127)

    def rows(self, part: slice) -> "Int8Linear":
        """The layer of output rows ``part`` only: the same int8 values and scales (one per row)."""
        bias = None if self.bias is None else self.bias[part]
        weight_int8, weight_scale = self.weight_int8[part], self.weight_scale[part]  # (rows, in), (rows,)
        return Int8Linear(weight_int8, weight_scale, bias, self.out_dtype, self.input_max)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (N, in)
        values, row_scale = quantize_per_row(rows, self.input_max)  # (N, in) uint8, (N, 1)
        # (N, out) fp32: the int32 sums times the weight's scales (input scale 1, zero point 128)
        out = torch.ops.onednn.qlinear_pointwise.tensor(
            values, ONE, ZERO_POINT_TENSOR, self.packed, self.weight_scale, self.weight_zero_point, None,
            1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        if self.bias is None:
            out = out.mul_(row_scale)  # (N, out)
        else:
            out = torch.addcmul(self.bias, out, row_scale)  # (N, out) bias + out * row_scale
        return out.to(self.out_dtype).reshape(*x.shape[:-1], self.out_features)  # (..., out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 -> {self.out_dtype}"


class Int8Rows:
    """``MultiHeadAttention.input_projection`` for an int8 packed projection: each part asked for
    (cross-attention asks for Q, then K and V) as an ``Int8Linear`` of those rows, made once."""

    def input_projection(self, x: torch.Tensor, part: slice) -> torch.Tensor:  # (B, T, D) -> (B, T, rows)
        parts = self.__dict__.setdefault("int8_parts", {})
        if (part.start, part.stop) not in parts:
            parts[part.start, part.stop] = self.qkv_proj.rows(part)
        return parts[part.start, part.stop](x)


class Int8Attention(Int8Rows, MultiHeadAttention):
    """The plain attention on an int8 projection."""


class Int8FastAttention(Int8Rows, FastMultiHeadAttention):
    """The fast tier's attention on an int8 projection."""


def quantized_model(model: Transformer, precision: str) -> Transformer:
    """A copy of ``model`` with ``Int8Linear`` layers for ``precision`` (one of ``QUANTIZED``), in eval mode,
    on the CPU; ``model`` itself is left as it is."""
    if precision not in QUANTIZED:
        raise ValueError(f"quantized precisions are {', '.join(QUANTIZED)}, got {precision!r}")
    _torchao(precision)  # refuse before copying when it is missing
    if not has_onednn_int8():
        raise ValueError(
            f"--precision {precision} needs PyTorch's oneDNN int8 kernels "
            "(torch.ops.onednn.qlinear_pointwise), which this PyTorch build lacks: use fp32 or bf16"
        )
    dtype = torch.bfloat16 if precision == INT8_BF16 else torch.float32  # of everything but the products
    quantized = copy.deepcopy(model).cpu().eval()  # fp32 weights are quantized, then the rest cast
    for parent in list(quantized.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                out_dtype = torch.float32 if child is quantized.output_proj else dtype  # fp32 logits
                setattr(parent, name, Int8Linear.quantize(child.weight, child.bias, out_dtype, precision))
    for parent in list(quantized.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, MultiHeadAttention):
                fast = isinstance(child, FastMultiHeadAttention)
                setattr(parent, name, twin(child, Int8FastAttention if fast else Int8Attention))
    return quantized.to(dtype)  # embeddings, LayerNorm; an Int8Linear keeps its own tensors


def quantized_decoding_model(
    model: Transformer, precision: str, device: torch.device
) -> tuple[Transformer, torch.dtype | None]:
    """``runtime.precision.decoding_model``, with the int8 precisions besides: on the CPU, a copy of the
    model with int8 linear layers, decoded without autocast (``model`` is left as it is). oneDNN's kernel
    cache is sized first: int8 layers make oneDNN primitives as they are built."""
    if precision not in QUANTIZED:
        return decoding_model(model, precision, device)
    if device.type != "cpu":
        raise ValueError(f"precision {precision} decodes on the CPU, not on {device}")
    size_onednn_cache(device, torch.int8)
    keep_freed_memory(device)
    return quantized_model(model, precision), None
