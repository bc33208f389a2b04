"""N-best lists: beam search's finished hypotheses, not only its best one, through its ``finished`` seam."""

import torch

from transformer.core.decoding import PLAIN, Kernels, Steering, beam_search
from transformer.core.model import Transformer


def beam_search_nbest(
    model: Transformer,
    src: torch.Tensor,
    beam_size: int,
    length_penalty: float,
    max_len_offset: int,
    nbest: int,
    steering: Steering | None = None,
    kernels: Kernels = PLAIN,
) -> list[list[tuple[list[int], float]]]:
    """src (B, S) -> per sentence, its ``nbest`` best finished hypotheses as (ids, log P(Y|X)), best first.

    The same search as ``beam_search`` (its first hypothesis is ``beam_search``'s output), ranked by
    log P / lp(|Y|) like it; log P is the natural-log probability of the tokens and of EOS (a hypothesis
    stopped at the length limit has no EOS, and its log P none). ``nbest`` <= ``beam_size``: a sentence
    may finish with only K hypotheses.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be in [1, beam_size={beam_size}], got {nbest}")
    finished: list[list[tuple[float, list[int], float]]] = [[] for _ in range(src.size(0))]
    beam_search(model, src, beam_size, length_penalty, max_len_offset, finished, steering, kernels)
    ranked = [sorted(hyps, key=lambda h: -h[0])[:nbest] for hyps in finished]  # stable: first found wins ties
    return [[(ids, log_p) for _, ids, log_p in hyps] for hyps in ranked]
