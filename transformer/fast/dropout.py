"""Dropout (§5.4) with a cheaper random mask on the CPU: the fast tier's twin of ``nn.Dropout``.

On the CPU, ``F.dropout`` draws one random number per element through the Mersenne Twister, a large share
of a training step (docs/benchmarks.md, "Speed choices in the code"). This version draws 64-bit words and
cuts each into four 16-bit numbers:
an element is dropped when its number is below ``round(p · 65536)``, so ``p`` is rounded to a multiple
of 1/65536 (0.1 becomes 0.100006) and the survivors are scaled by 1 / (1 − that p), keeping the expectation
exact. On other devices, and under ``torch.compile`` (whose graphs it would break), ``F.dropout`` is used
as is. Both draw from PyTorch's global generator, so
``torch.manual_seed`` and saved RNG states make runs repeatable.
"""

import torch
import torch.nn.functional as F
from torch import nn


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():  # a graph break under torch.compile
        return F.dropout(x, p, training=True)
    kept, scale = _draw_kept(x, p)
    return _ScaleKept.apply(x, kept, scale)


def relu_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``dropout(relu(x), p)``, equal to it (the same random numbers), with one mask for both: what the
    backward pass keeps is 1 byte an element, where ReLU alone would keep its output (4 bytes in fp32).
    Without autograd (decoding) and without dropout, ``x`` is overwritten: no new (B, T, d_ff) tensor."""
    if not training and not torch.is_grad_enabled():
        return F.relu_(x)
    if not training or p == 0.0 or x.device.type != "cpu" or torch.compiler.is_compiling():
        return dropout(F.relu(x), p, training)
    kept, scale = _draw_kept(x, p)
    return _ScaleKept.apply(x, kept & (x > 0), scale)


def _draw_kept(x: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """(kept: bool, x's shape; 1 / (1 - p) with p rounded to a multiple of 1/65536)."""
    n = x.numel()
    drop_below = round(p * 65536)  # of 65536 equally likely 16-bit values
    # each 64-bit word as the generator gives it (``to=None``: no 64-bit division by the range, see
    # docs/benchmarks.md, "Speed choices in the code"), its top bit flipped: the very words of
    # ``random_(-2**63, 2**63 - 1)`` from the same generator state
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None).bitwise_xor_(-(2**63))
    numbers = words.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]
    return numbers >= drop_below - 32768, 65536 / (65536 - drop_below)


class _ScaleKept(torch.autograd.Function):
    """x · (kept ? scale : 0), keeping for the backward pass the 1-byte ``kept`` mask rather than the
    mask of 0 / scale in x's dtype that ``x * mask`` would keep (4 bytes an element in fp32)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, kept: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(kept)
        ctx.scale = scale
        return x * _mask(kept, scale, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (kept,) = ctx.saved_tensors
        return grad * _mask(kept, ctx.scale, grad), None, None


def _mask(kept: torch.Tensor, scale: float, like: torch.Tensor) -> torch.Tensor:
    """0 or 1 / (1 - p), in ``like``'s dtype: one tensor, multiplied in one go. The bool mask is read as
    the uint8 0 / 1 it is stored as: on the CPU, bool -> float (or ``torch.where`` on it) is slower."""
    return kept.view(torch.uint8).to(like.dtype).mul_(scale)


class Dropout(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
