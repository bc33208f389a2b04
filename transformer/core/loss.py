"""The training loss: summed, label-smoothed cross-entropy over the real target tokens (§5.4), on logits."""

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def token_loss(
    logits: torch.Tensor,
    tgt_out: torch.Tensor,
    pad_id: int,
    label_smoothing: float,
    never_produced: Sequence[int] = (),
) -> torch.Tensor:
    """Summed cross-entropy over the non-pad target tokens. logits (B, T, V), tgt_out (B, T).

    Label smoothing (§5.4): the target distribution puts 1 - ε on the reference token and spreads ε evenly
    over the tokens the decoder can produce, i.e. every token but ``never_produced``
    (``model.never_produced``: PAD and the start token). With no ``never_produced`` this is
    ``F.cross_entropy(label_smoothing=ε)``.
    """
    logits, target = logits.flatten(0, 1).float(), tgt_out.flatten()  # (B·T, V), (B·T,)
    if label_smoothing == 0.0:
        return F.cross_entropy(logits, target, ignore_index=pad_id, reduction="sum")
    return smoothed_nll(torch.log_softmax(logits, dim=-1), target, label_smoothing, never_produced, pad_id)


def smoothed_nll(log_probs, target, eps: float, never_produced: Sequence[int], pad_id: int | None = None):
    """Σ over rows of (1 - ε)·(-log p_y) + ε · mean over the producible tokens of (-log p). (N, V), (N,)."""
    never_produced = sorted(set(never_produced))
    nll = -log_probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)  # (N,)
    n_allowed = log_probs.size(-1) - len(never_produced)
    smooth = (
        -(log_probs.sum(dim=-1) - log_probs[:, never_produced].sum(dim=-1)) / n_allowed
    )  # (N,) mean -log p
    per_token = (1.0 - eps) * nll + eps * smooth  # (N,)
    return per_token.sum() if pad_id is None else per_token.masked_fill(target == pad_id, 0.0).sum()
