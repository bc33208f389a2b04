"""The training loss of the fast tier: ``core/loss.py``'s ``token_loss`` from the decoder's output features
and the output projection, computed a block of rows at a time, so that the
(tokens, V) logits never exist whole. With V = 8000, logits, log-probabilities and their gradients take
32 KB per target token each, the largest tensors of a training step; a plain ``token_loss(proj(x))``
keeps two of them through the forward pass and three at a time in the backward pass. Under autocast
(bf16 / fp16) the gradient of the logits is kept whole in that precision (2 bytes an entry), for one
weight-gradient matmul instead of one per block.

The gradient with respect to the logits has a closed form,

    ∂loss/∂logit_j = p_j − (1 − ε) · [j = y] − ε / V' · [j producible]      (p = softmax, 0 on padding)

so each block's gradients (features, weight, bias) are computed right after its loss, in the forward pass,
and the backward pass only scales them by the incoming gradient. Padding rows are skipped: they have no
loss and no gradient. ``output_loss`` equals ``token_loss`` to float rounding, gradients included
(tests/fast/test_fast_output_loss.py).
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from transformer.core.loss import smoothed_nll

# logits per block of rows: 16 MB in fp32 (524 rows of an 8000-token vocabulary), the fastest of 65-1048 rows
# (docs/benchmarks.md, "Speed choices in the code")
BLOCK_ELEMENTS = 2**22


def output_loss(
    features: torch.Tensor,
    output_proj: nn.Linear,
    tgt_out: torch.Tensor,
    pad_id: int,
    label_smoothing: float,
    never_produced: Sequence[int] = (),
) -> torch.Tensor:
    """``token_loss(output_proj(features), ...)`` without whole logits. features (B, T, D), tgt_out (B, T).

    Run it where the model ran (under the same autocast): the projection's matmuls follow it.
    """
    real = (tgt_out != pad_id).flatten().nonzero().squeeze(1)  # (N,) rows that have a loss
    x, target = features.flatten(0, 1).index_select(0, real), tgt_out.flatten()[real]  # (N, D), (N,)
    w, b = output_proj.weight, output_proj.bias
    args = (target, label_smoothing, sorted(set(never_produced)))
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in (x, w, b) if t is not None):
        return _blocks_loss(x, w, b, *args)
    return _OutputLoss.apply(x, w, *args, b)


def _blocks(n_rows: int, vocab_size: int):
    step = max(1, BLOCK_ELEMENTS // vocab_size)
    return (slice(start, start + step) for start in range(0, n_rows, step))


def _block_log_probs(x, w, b, rows: slice) -> torch.Tensor:
    return torch.log_softmax(F.linear(x[rows], w, b).float(), dim=-1)  # (n, V)


def _autocast_operands(x, w, b):
    """x, w, b in the precision autocast multiplies them in (bf16 / fp16), cast once for all the blocks:
    left to autocast, the (V, D) weight was cast again for every block and every matmul (16 times a step)."""
    if not torch.is_autocast_enabled(x.device.type):
        return x, w, b
    low = torch.get_autocast_dtype(x.device.type)
    return tuple(None if t is None else t.to(low) for t in (x, w, b))


def _blocks_loss(x, w, b, target, eps, never_produced) -> torch.Tensor:
    """The loss alone (no gradient wanted)."""
    x, w, b = _autocast_operands(x, w, b)
    total = torch.zeros((), device=x.device)
    for rows in _blocks(x.size(0), w.size(0)):
        total += smoothed_nll(_block_log_probs(x, w, b, rows), target[rows], eps, never_produced)
    return total


class _OutputLoss(torch.autograd.Function):
    """Loss and, already, its gradients, a block of rows at a time; backward scales them."""

    @staticmethod
    def forward(ctx, x, w, target, eps: float, never_produced: list[int], b=None):
        total = torch.zeros((), device=x.device)
        grad_x = torch.empty_like(x)  # (N, D)
        accumulate = torch.promote_types(w.dtype, torch.float32)  # fp32, or fp64 for a float64 model
        grad_w = torch.zeros_like(w, dtype=accumulate)  # (V, D)
        grad_b = None if b is None else torch.zeros_like(b, dtype=accumulate)  # (V,)
        ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
        x, w, b = _autocast_operands(x, w, b)
        low = x.dtype != accumulate  # under autocast: bf16 / fp16 operands
        # in low precision the whole (N, V) gradient is kept (2 bytes an entry) for ONE weight-gradient
        # matmul: a (V, D) product and an fp32 sum per block cost more than the block's matmuls themselves
        grad_logits = torch.empty((x.size(0), w.size(0)), dtype=x.dtype, device=x.device) if low else None
        for rows in _blocks(x.size(0), w.size(0)):
            log_probs = _block_log_probs(x, w, b, rows)  # (n, V)
            total += smoothed_nll(log_probs, target[rows], eps, never_produced)
            grad = log_probs.exp_()  # (n, V) p, in the log-probabilities' memory, then ∂loss/∂logits:
            grad.sub_(eps / (w.size(0) - len(never_produced)))  # − ε / V' on every column ...
            if never_produced:
                grad[:, never_produced] += eps / (
                    w.size(0) - len(never_produced)
                )  # ... but the never-produced ones
            grad.scatter_add_(1, target[rows, None], grad.new_full((grad.size(0), 1), eps - 1.0))  # − (1 − ε)
            if grad_b is not None:
                grad_b += grad.sum(dim=0)
            if low:
                grad_logits[rows] = grad  # (n, V) cast to the operands' precision as it is stored
                grad = grad_logits[rows]
            else:
                grad = grad.to(x.dtype)  # (n, V) in the operands' precision
                grad_w.addmm_(grad.t(), x[rows])  # (V, D) += (V, n) @ (n, D), added by the matmul
            grad_x[rows] = grad @ w  # (n, D)
        if low:
            grad_w += grad_logits.t() @ x  # (V, D) = (V, N) @ (N, D), then an fp32 sum
        ctx.save_for_backward(grad_x, grad_w, *(() if grad_b is None else (grad_b,)))
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable  # the saved gradients are constants: no second derivative
    def backward(ctx, grad_loss):
        grad_x, grad_w, *grad_b = (g * grad_loss for g in ctx.saved_tensors)
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        grad_b = grad_b[0].to(b_dtype) if grad_b else None
        return grad_x.to(x_dtype), grad_w.to(w_dtype), None, None, None, grad_b
