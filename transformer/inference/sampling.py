"""Sampling the next token instead of taking the most probable one: for back-translation and diverse outputs.

    p(y) ∝ exp(logit(y) / temperature), restricted to the ``top_k`` most probable tokens and then to the
    nucleus: the fewest most probable tokens whose probabilities sum to at least ``top_p``.

``temperature = 0`` is greedy search (the argmax), ``top_k = 0`` and ``top_p = 1`` restrict nothing. A draw is
never PAD or the start token (decoding rules them out) nor UNK, unless ``allow_unk`` or a prefix forces it
(a prefix's tokens are forced before any ban): an unknown piece prints as "⁇", which no back-translation
wants. The draws come from one ``torch.Generator`` seeded with ``seed``, so the same inputs, settings and
seed give the same samples; a different seed, different ones.
"""

from dataclasses import dataclass

import torch

from transformer.core.decoding import best_token


@dataclass(frozen=True)
class Sampling:
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    allow_unk: bool = False  # let UNK be drawn

    def __post_init__(self):
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = no limit), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")

    def generator(self, device: torch.device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed)


def allowed_tokens(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens sampling may draw: logits (N, V) -> (N, V) bool, the top k, then the nucleus of top p.

    Probabilities here are those of the (tempered) logits given; ties at the k-th logit are all kept.
    """
    allowed = torch.isfinite(logits)  # (N, V): never a ruled-out token
    if top_k > 0 and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (N, 1) the k-th largest logit
        allowed &= logits >= kth
    if top_p < 1.0:
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)  # (N, V)
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (N, V) each
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (N, V): the mass of the tokens ranked above
        in_nucleus = torch.zeros_like(allowed).scatter(-1, order, before < top_p)  # (N, V)
        allowed &= in_nucleus
    return allowed


def sample_tokens(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator, unk_id: int | None = None
) -> torch.Tensor:
    """One token per row of logits (N, V) -> (N,) long, drawn as the module docstring says; ``unk_id``:
    the token drawn only with ``sampling.allow_unk``."""
    if sampling.temperature == 0.0:
        return best_token(logits)  # (N,) greedy search's pick
    tempered = logits.float() / sampling.temperature  # (N, V)
    if unk_id is not None and not sampling.allow_unk:
        ruled_out = tempered[:, unk_id].clone()  # (N,)
        tempered[:, unk_id] = float("-inf")
        forced = ~torch.isfinite(tempered).any(dim=-1)  # (N,) a prefix forces UNK: forced before any ban
        tempered[forced, unk_id] = ruled_out[forced]
    allowed = allowed_tokens(tempered, sampling.top_k, sampling.top_p)  # (N, V)
    probs = torch.softmax(tempered.masked_fill(~allowed, float("-inf")), dim=-1)  # (N, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
