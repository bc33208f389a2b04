"""The training loss: summed, label-smoothed cross-entropy over the real target tokens (§5.4).

``token_loss`` is the definition, on logits. ``output_loss`` is what training runs: the same loss from the
decoder's output features and the output projection, computed a block of rows at a time, so that the
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
(tests/test_loss.py).
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

BLOCK_ELEMENTS = 2**20  # logits per block of rows: 4 MB in fp32 (128 rows of an 8000-token vocabulary)


def token_loss(
    logits: torch.Tensor,
    tgt_out: torch.Tensor,
    pad_id: int,
    label_smoothing: float,
    never_targets: Sequence[int] = (),
) -> torch.Tensor:
    """Summed cross-entropy over the non-pad target tokens. logits (B, T, V), tgt_out (B, T).

    Label smoothing (§5.4): the target distribution puts 1 - ε on the reference token and spreads ε evenly
    over the tokens the decoder can produce, i.e. every token but ``never_targets``
    (``model.never_produced``: PAD and the start token). With no ``never_targets`` this is
    ``F.cross_entropy(label_smoothing=ε)``.
    """
    logits, target = logits.flatten(0, 1).float(), tgt_out.flatten()  # (B·T, V), (B·T,)
    if label_smoothing == 0.0:
        return F.cross_entropy(logits, target, ignore_index=pad_id, reduction="sum")
    return _smoothed_nll(torch.log_softmax(logits, dim=-1), target, label_smoothing, never_targets, pad_id)


def _smoothed_nll(log_probs, target, eps: float, excluded: Sequence[int], pad_id: int | None = None):
    """Σ over rows of (1 - ε)·(-log p_y) + ε · mean over the producible tokens of (-log p). (N, V), (N,)."""
    excluded = sorted(set(excluded))
    nll = -log_probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)  # (N,)
    n_allowed = log_probs.size(-1) - len(excluded)
    smooth = -(log_probs.sum(dim=-1) - log_probs[:, excluded].sum(dim=-1)) / n_allowed  # (N,) mean -log p
    per_token = (1.0 - eps) * nll + eps * smooth  # (N,)
    return per_token.sum() if pad_id is None else per_token.masked_fill(target == pad_id, 0.0).sum()


def output_loss(
    features: torch.Tensor,
    output_proj: nn.Linear,
    tgt_out: torch.Tensor,
    pad_id: int,
    label_smoothing: float,
    never_targets: Sequence[int] = (),
) -> torch.Tensor:
    """``token_loss(output_proj(features), ...)`` without whole logits. features (B, T, D), tgt_out (B, T).

    Run it where the model ran (under the same autocast): the projection's matmuls follow it.
    """
    real = (tgt_out != pad_id).flatten().nonzero().squeeze(1)  # (N,) rows that have a loss
    x, target = features.flatten(0, 1).index_select(0, real), tgt_out.flatten()[real]  # (N, D), (N,)
    w, b = output_proj.weight, output_proj.bias
    args = (target, label_smoothing, sorted(set(never_targets)))
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


def _blocks_loss(x, w, b, target, eps, excluded) -> torch.Tensor:
    """The loss alone (no gradient wanted)."""
    x, w, b = _autocast_operands(x, w, b)
    total = torch.zeros((), device=x.device)
    for rows in _blocks(x.size(0), w.size(0)):
        total += _smoothed_nll(_block_log_probs(x, w, b, rows), target[rows], eps, excluded)
    return total


class _OutputLoss(torch.autograd.Function):
    """Loss and, already, its gradients, a block of rows at a time; backward scales them."""

    @staticmethod
    def forward(ctx, x, w, target, eps: float, excluded: list[int], b=None):
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
            total += _smoothed_nll(log_probs, target[rows], eps, excluded)
            grad = log_probs.exp_()  # (n, V) p, in the log-probabilities' memory, then ∂loss/∂logits:
            grad.sub_(eps / (w.size(0) - len(excluded)))  # − ε / V' on every column ...
            if excluded:
                grad[:, excluded] += eps / (w.size(0) - len(excluded))  # ... but the never-produced ones
            grad.scatter_add_(1, target[rows, None], grad.new_full((grad.size(0), 1), eps - 1.0))  # − (1 − ε)
            if grad_b is not None:
                grad_b += grad.sum(dim=0)
            grad = grad.to(x.dtype)  # (n, V) in the operands' precision
            grad_x[rows] = grad @ w  # (n, D)
            if low:
                grad_logits[rows] = grad
            else:
                grad_w.addmm_(grad.t(), x[rows])  # (V, D) += (V, n) @ (n, D), added by the matmul
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
