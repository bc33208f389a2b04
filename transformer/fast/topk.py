"""Each row's k largest scores over a large vocabulary, for beam search: ``torch.topk`` in two cheap passes.

``torch.topk`` on the CPU copies every row into (value, index) pairs and partially sorts them, the second
largest cost of a beam-search step after the matmuls (docs/benchmarks.md, "Speed choices in the code"). Here:

1. the max of every block of ``BLOCK`` consecutive entries (a vectorised reduction, much cheaper);
2. the k blocks with the largest maxima: each of the row's k largest entries lies in one of them (a block
   holding one has a max at least as large, and at most k blocks have a max that large, up to ties);
3. ``torch.topk`` over those k blocks' entries and the entries after the last whole block.

Same values as ``torch.topk``; among equal scores the indices may differ (torch.topk does not define them).
On a GPU ``torch.topk`` is one kernel and is used as it is.
"""

import torch

BLOCK = (
    64  # entries per block (the fastest size for vocabularies of 8000 and 32000: see the module docstring)
)


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (N, V) -> (values (N, k) sorted descending, indices (N, k) long): each row's k largest."""
    N, V = scores.shape
    n_blocks = V // BLOCK
    if n_blocks < 4 * k or scores.device.type != "cpu":  # a small vocabulary, or a GPU's one-kernel topk
        return scores.topk(k, dim=-1)
    blocks = scores[:, : n_blocks * BLOCK].view(N, n_blocks, BLOCK)  # (N, n_blocks, BLOCK)
    top_blocks = blocks.amax(dim=-1).topk(k, dim=-1).indices  # (N, k)
    rows = torch.arange(N, device=scores.device)[:, None]  # (N, 1)
    candidates = blocks[rows, top_blocks].view(N, k * BLOCK)  # (N, k·BLOCK) the k blocks' entries
    tail = scores[:, n_blocks * BLOCK :]  # (N, V mod BLOCK) after the last whole block
    values, picked = torch.cat([candidates, tail], dim=1).topk(k, dim=-1)  # (N, k) positions in candidates
    in_blocks = picked < k * BLOCK  # (N, k)
    block_of = top_blocks.gather(1, (picked // BLOCK).clamp(max=k - 1))  # (N, k)
    indices = torch.where(in_blocks, block_of * BLOCK + picked % BLOCK, picked - k * BLOCK + n_blocks * BLOCK)
    return values, indices  # (N, k) each
