"""Prefix-constrained decoding: translations that start with given target tokens (``--prefix``), for both
searches through their ``Steering`` seam (``core/decoding.py``).

While a hypothesis is inside its prefix, every other token is ruled out of its next-token scores, after the
log-softmax in beam search: the prefix's tokens are scored with their real probabilities, and the rest is
searched as usual. A sentence's length limit is its source-based one plus its prefix's tokens: the prefix
leaves the rest of the translation its room.
"""

import torch

from transformer.core.decoding import Steering


class Prefix(Steering):
    """``prefix`` (N, P) long: per hypothesis, the target tokens it must start with, -1 after its prefix's
    end; ``max_positions``: the model's, which no length limit passes."""

    def __init__(self, prefix: torch.Tensor, max_positions: int):
        self.prefix, self.max_positions = prefix, max_positions

    @classmethod
    def of(cls, prefixes: list[list[int]] | None, rows: list[int], device, max_positions: int):
        """The prefixes of a batch's sentences (``rows`` of ``prefixes``); None if all are empty."""
        if prefixes is None or not any(prefixes[i] for i in rows):
            return None
        P = max(len(prefixes[i]) for i in rows)
        table = [prefixes[i] + [-1] * (P - len(prefixes[i])) for i in rows]
        return cls(torch.tensor(table, dtype=torch.long, device=device), max_positions)  # (B, P)

    def limits(self, limits: torch.Tensor) -> torch.Tensor:
        """Room for the prefix beyond the source-based limits. limits (B,) -> (B,)."""
        return (limits + (self.prefix >= 0).sum(dim=1).to(limits.device)).clamp(max=self.max_positions)

    def restrict(self, scores: torch.Tensor, step: int, rows: torch.Tensor) -> torch.Tensor:
        """Rows whose prefix has a token at ``step``: every other token ruled out. scores (N, V), in place."""
        if step >= self.prefix.size(1):
            return scores
        wanted = self.prefix[rows, step]  # (N,) -1 = free
        forced = (wanted >= 0).nonzero().flatten()  # (N_forced,)
        if forced.numel():
            kept = scores[forced, wanted[forced]]  # (N_forced,)
            scores[forced] = float("-inf")
            scores[forced, wanted[forced]] = kept
        return scores

    def keep(self, rows: torch.Tensor) -> None:
        self.prefix = self.prefix[rows]
