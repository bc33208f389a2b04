"""Decoding's linear layers on prepacked weights (a CPU, fp32, no autograd): the same math, faster.

A decoding step multiplies few rows (one per live hypothesis, down to a handful as sentences finish) by
every weight of the decoder and the output layer. ``F.linear`` lays each weight out for its matmul kernel on
every call; oneDNN's linear can take a weight laid out once (``torch.ops.mkldnn._reorder_linear_weight``,
what Inductor does for frozen CPU models) and then runs those products faster at tens of rows, level at a
few hundred. The translator packs for beam search only, where it gains with every line the same; greedy
search gains nothing (docs/benchmarks.md, "Speed choices in the code").

``packed_decoder(model)`` puts a ``PackedLinear`` in the place of each of these layers, its weight packed
at that moment, and puts the layers back on exit, so a model still being trained (validation decodes it
between updates) is never decoded with stale weights. Anywhere the packed kernel cannot be used (another
device or dtype, autograd on, quantized weights, a PyTorch without oneDNN or without these ops), nothing
changes.
"""

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from transformer.core.model import Transformer

ROWS_HINT = 64  # the rows oneDNN lays a weight out for; any number of rows is multiplied correctly
# Packing takes about what the faster products save in decoding a few dozen sentences: a search of fewer
# sentences (an interactive line) is not worth it. Not cached across searches, because
# PyTorch's fused Adam updates weights in place without bumping their version counter: a cache could not
# tell that a model being trained has changed.
WORTH_PACKING = 64  # sentences


def _can_pack(linears: list[nn.Linear]) -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
        and not torch.is_grad_enabled()
        and all(
            isinstance(m, nn.Linear)  # not an int8 layer (quantize.py)
            and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32
            for m in linears
        )
    )


class PackedLinear(nn.Module):
    """``linear``'s function on its weight laid out by oneDNN (a copy made now): (..., in) -> (..., out).
    Its forward hooks run as they would on ``linear``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias  # as they are: for slices of them (attention)
        self._forward_pre_hooks, self._forward_hooks = linear._forward_pre_hooks, linear._forward_hooks
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT)
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")


@contextlib.contextmanager
def packed_decoder(model: Transformer, enabled: bool = True) -> Iterator[None]:
    """Within the block, the decoder's ``nn.Linear`` layers and the output layer are ``PackedLinear``
    layers, packed on entry, when they can be (see the module docstring); ``enabled=False``: never."""
    places = [(parent, name, child) for parent in [model, *model.decoder.modules()]
              for name, child in parent.named_children() if isinstance(child, nn.Linear)
              and (parent is not model or name == "output_proj")]  # fmt: skip
    if not (enabled and _can_pack([linear for _, _, linear in places])):
        yield
        return
    try:
        for parent, name, linear in places:
            setattr(parent, name, PackedLinear(linear))
        yield
    finally:
        for parent, name, linear in places:
            setattr(parent, name, linear)
