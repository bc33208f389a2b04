"""Decoding: batched greedy search and beam search with the key/value cache. Ids in, ids out.

The encoder runs once per batch; the cross-attention keys/values of the memory are computed on the first
step and reused (see ``MultiHeadAttention``); each step feeds only the newest token. A sentence may produce
at most ``source length + max_len_offset`` tokens (§6.1 uses +50). Outputs exclude BOS and EOS.
"""

import torch

from transformer.model import Cache, Transformer


def _select_rows(cache: Cache, rows: torch.Tensor, parts=("self", "cross")) -> None:
    """Keep (and reorder) the batch rows ``rows`` of the cached key / value tensors, in place."""
    for layer in cache:
        for part in (layer[p] for p in parts):
            for name, tensor in part.items():
                part[name] = tensor.index_select(0, rows)


def _max_lengths(src: torch.Tensor, pad_id: int, max_len_offset: int) -> torch.Tensor:
    return (src != pad_id).sum(dim=1) + max_len_offset  # (B,)


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    bos_id: int,
    eos_id: int,
    max_len_offset: int = 50,
    use_cache: bool = True,
) -> list[list[int]]:
    """src (B, S) -> B token-id lists. Finished sentences leave the batch so the rest runs faster.

    ``use_cache=False`` recomputes the whole prefix at every step (the slow reference decoder).
    """
    B = src.size(0)
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    max_lengths = _max_lengths(src, model.pad_id, max_len_offset)  # (B,)
    outputs: list[list[int]] = [[] for _ in range(B)]
    active = torch.arange(B, device=src.device)  # original row of each row still decoding
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B_active, 1 + t)
    cache = model.new_cache() if use_cache else None
    for step in range(int(max_lengths.max())):
        inputs = tokens[:, -1:] if use_cache else tokens
        logits, _, _ = model.decode(inputs, memory, src_mask, cache)  # (B_active, 1 | t, V)
        next_tokens = logits[:, -1].argmax(dim=-1)  # (B_active,)
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
        done = (next_tokens == eos_id) | (step + 1 >= max_lengths[active])  # (B_active,)
        for row in done.nonzero().flatten().tolist():
            out = tokens[row, 1:].tolist()
            outputs[active[row]] = out[:-1] if out[-1] == eos_id else out
        if done.all():
            break
        if done.any():  # drop finished sentences from every tensor of the batch
            keep = (~done).nonzero().flatten()  # (B_active',)
            active, tokens = active[keep], tokens[keep]
            memory, src_mask = memory[keep], src_mask[keep]
            if cache is not None:
                _select_rows(cache, keep)
    return outputs


def length_penalty(length: torch.Tensor, alpha: float) -> torch.Tensor:
    """GNMT's ((5 + |Y|) / 6)^α, the length normalisation used with beam search in the paper (§6.1)."""
    return ((5.0 + length.float()) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: torch.Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
) -> list[list[int]]:
    """src (B, S) -> B token-id lists: the best of K beams by log P(Y|X) / lp(|Y|).

    Every sentence keeps K hypotheses; a finished one stays in its beam with a frozen score (it can only
    be "extended" by EOS at no cost), so the tensors keep their shape (B·K, ...) throughout.
    """
    B, K, device = src.size(0), beam_size, src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D)
    memory = memory.repeat_interleave(K, dim=0)  # (B·K, S, D)
    src_mask = src_mask.repeat_interleave(K, dim=0)  # (B·K, 1, 1, S)
    max_lengths = _max_lengths(src, model.pad_id, max_len_offset).repeat_interleave(K)  # (B·K,)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all K beams start as the same BOS hypothesis: keep only one of them alive
    scores = scores.view(-1)  # (B·K,)
    tokens = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)  # (B·K, 1 + t)
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    lengths = torch.zeros(B * K, dtype=torch.long, device=device)  # tokens produced, EOS included
    cache = model.new_cache()
    for step in range(int(max_lengths.max())):
        logits, _, _ = model.decode(tokens[:, -1:], memory, src_mask, cache)  # (B·K, 1, V)
        log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B·K, V)
        V = log_probs.size(-1)
        # a finished hypothesis continues only with EOS, at no cost
        log_probs[finished] = float("-inf")
        log_probs[finished, eos_id] = 0.0
        candidates = (scores[:, None] + log_probs).view(B, K * V)  # (B, K·V)
        top_scores, top = candidates.topk(K, dim=-1)  # (B, K)
        origin = (top // V + torch.arange(B, device=device)[:, None] * K).view(-1)  # (B·K,) source beam
        next_tokens = (top % V).view(-1)  # (B·K,)
        scores = top_scores.view(-1)
        was_finished = finished[origin]
        lengths = lengths[origin] + (~was_finished).long()
        # a hypothesis ends at EOS or at its length limit (as in greedy decoding)
        finished = was_finished | (next_tokens == eos_id) | (lengths >= max_lengths)
        tokens = torch.cat([tokens[origin], next_tokens[:, None]], dim=1)  # (B·K, 2 + t)
        _select_rows(cache, origin, parts=("self",))  # the memory's keys/values are the same per beam
        if finished.all():
            break
    normalised = (scores / length_penalty(lengths, alpha)).view(B, K)  # (B, K)
    best = normalised.argmax(dim=-1) + torch.arange(B, device=device) * K  # (B,)
    outputs = []
    for row, n in zip(best.tolist(), lengths[best].tolist(), strict=True):
        out = tokens[row, 1 : 1 + n].tolist()
        outputs.append(out[:-1] if out and out[-1] == eos_id else out)
    return outputs
