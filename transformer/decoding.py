"""Decoding: batched greedy search and beam search with the key/value cache (§6.1). Ids in, ids out.

The encoder runs once per batch; the cross-attention keys/values of the memory are computed on the first
step and reused (see ``MultiHeadAttention``); each step feeds only the newest token. Sentences whose
search is over leave the batch, so the rest runs faster.

Length limit: a sentence produces at most ``source length + max_len_offset`` tokens, EOS included, where
the source length counts the source's EOS (§6.1: input length + 50), and never more than
``model.config.max_positions`` (the decoder has no position beyond). A sentence that hits the limit ends
there without EOS.

Neither search produces PAD or BOS: they are never training targets, and a PAD fed back would be masked
by the full-prefix decoder (``use_cache=False``) but not by the cache, so the two would disagree.
Outputs exclude BOS and EOS.
"""

import torch

from transformer.model import Cache, Transformer


def _select_rows(cache: Cache, rows: torch.Tensor, parts=("self", "cross")) -> None:
    """Keep (and reorder) the batch rows ``rows`` of the cached key / value tensors, in place."""
    for layer in cache:
        for part in (layer[p] for p in parts):
            for name, tensor in part.items():
                part[name] = tensor.index_select(0, rows)


def _contiguous_memory_cache(cache: Cache) -> None:
    """Store the memory's keys/values contiguously (they come as views of one fused projection), so that
    the attention matmuls of every later step need not copy them: ~8% of cached greedy decoding on a CPU."""
    for layer in cache:
        for name, tensor in layer["cross"].items():
            layer["cross"][name] = tensor.contiguous()


def max_lengths(model: Transformer, src: torch.Tensor, max_len_offset: int) -> torch.Tensor:
    """The most tokens (EOS included) each sentence may produce. src (B, S) -> (B,) long."""
    source_lengths = (src != model.pad_id).sum(dim=1)  # (B,) with the source's EOS
    return (source_lengths + max_len_offset).clamp(min=1, max=model.config.max_positions)


def _next_token_logits(logits: torch.Tensor, pad_id: int, bos_id: int) -> torch.Tensor:
    """The last position's logits (N, T, V) -> (N, V), with PAD and BOS ruled out."""
    logits = logits[:, -1]  # (N, V)
    logits[:, pad_id] = float("-inf")
    logits[:, bos_id] = float("-inf")
    return logits


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    bos_id: int,
    eos_id: int,
    max_len_offset: int = 50,
    use_cache: bool = True,
) -> list[list[int]]:
    """src (B, S) -> B token-id lists: the most probable token at every step.

    ``use_cache=False`` recomputes the whole prefix at every step (the slow reference decoder).
    """
    B, device = src.size(0), src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    limits = max_lengths(model, src, max_len_offset)  # (B,)
    L = int(limits.max())
    outputs: list[list[int]] = [[] for _ in range(B)]
    active = torch.arange(B, device=device)  # original row of each row still decoding
    tokens = torch.full((B, L + 1), bos_id, dtype=torch.long, device=device)  # (B_active, 1 + L)
    cache = model.new_cache() if use_cache else None
    for step in range(L):
        inputs = tokens[:, step : step + 1] if use_cache else tokens[:, : step + 1]  # (B_active, 1 | 1+t)
        logits, _, _ = model.decode(inputs, memory, src_mask, cache)  # (B_active, 1 | 1+t, V)
        if step == 0 and cache is not None:
            _contiguous_memory_cache(cache)
        next_tokens = _next_token_logits(logits, model.pad_id, bos_id).argmax(dim=-1)  # (B_active,)
        tokens[:, step + 1] = next_tokens
        done = (next_tokens == eos_id) | (step + 1 >= limits)  # (B_active,)
        done_rows = done.nonzero().flatten()  # (B_done,)
        if done_rows.numel() == 0:
            continue
        for original, out in zip(active[done_rows].tolist(), tokens[done_rows, 1 : step + 2].tolist()):
            outputs[original] = out[:-1] if out[-1] == eos_id else out
        if done_rows.numel() == active.numel():
            break
        keep = (~done).nonzero().flatten()  # (B_active',) drop finished sentences from every tensor
        active, tokens, limits = active[keep], tokens[keep], limits[keep]
        memory, src_mask = memory[keep], src_mask[keep]
        if cache is not None:
            _select_rows(cache, keep)
    return outputs


def length_penalty(length, alpha: float):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α, the length normalisation used with beam search in the paper (§6.1).

    |Y| counts the EOS token when there is one. ``length``: a number or a tensor.
    """
    return ((5.0 + length) / 6.0) ** alpha


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
    """src (B, S) -> B token-id lists: the best finished hypothesis by log P(Y|X) / lp(|Y|).

    Each sentence keeps K live hypotheses. Every step takes the 2K best one-token extensions by log P
    (at most K of them end in EOS, so K others can live on): an extension ending in EOS that ranks among
    the first K is finished and scored by log P / lp(|Y|); the K best that do not end in EOS live on.
    A sentence is done when it has K finished hypotheses, or at its length limit (where the K best
    extensions are finished as they are). As in fairseq; with K = 1 this is exactly greedy search.
    Tensors are (B·K, ...), sentence-major: rows b·K ... b·K + K - 1 are sentence b's beams.

    Beam search is not exact: it may prune the prefix of a better hypothesis (even greedy's). When K is
    at least the number of extensions there are, nothing is pruned and it finds the best hypothesis.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    B, K, device = src.size(0), beam_size, src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D)
    memory = memory.repeat_interleave(K, dim=0)  # (B·K, S, D)
    src_mask = src_mask.repeat_interleave(K, dim=0)  # (B·K, 1, 1, S)
    limits = max_lengths(model, src, max_len_offset)  # (B,)
    L = int(limits.max())
    dtype = torch.promote_types(model.output_proj.weight.dtype, torch.float32)  # of the scores
    scores = torch.full((B, K), float("-inf"), dtype=dtype, device=device)
    scores[:, 0] = 0.0  # all K beams start as the same BOS hypothesis: keep only one of them alive
    scores = scores.view(-1)  # (B·K,) log P of each live hypothesis
    tokens = torch.full((B * K, L + 1), bos_id, dtype=torch.long, device=device)  # (B·K, 1 + L)
    best_scores = torch.full((B,), float("-inf"), dtype=dtype, device=device)  # of the best finished
    n_finished = torch.zeros(B, dtype=torch.long, device=device)
    active = torch.arange(B, device=device)  # original sentence of each block of K rows
    outputs: list[list[int]] = [[] for _ in range(B)]
    beams = torch.arange(K, device=device)
    first_k = torch.arange(2 * K, device=device) < K  # (2K,) the K best of the 2K extensions
    cache = model.new_cache()
    for step in range(L):
        n = active.numel()
        logits, _, _ = model.decode(tokens[:, step : step + 1], memory, src_mask, cache)  # (n·K, 1, V)
        if step == 0:
            _contiguous_memory_cache(cache)
        logits = _next_token_logits(logits, model.pad_id, bos_id)  # (n·K, V)
        log_probs = torch.log_softmax(logits.to(dtype), dim=-1)  # (n·K, V)
        V = log_probs.size(-1)
        candidates = (scores[:, None] + log_probs).view(n, K * V)  # (n, K·V)
        top_scores, top = candidates.topk(2 * K, dim=-1)  # (n, 2K)
        origin = top // V + (torch.arange(n, device=device) * K)[:, None]  # (n, 2K) row extended
        next_tokens = top % V  # (n, 2K)
        ends = next_tokens == eos_id  # (n, 2K)
        at_limit = step + 1 >= limits  # (n,) all hypotheses have step + 1 tokens now
        finishing = (ends | at_limit[:, None]) & first_k & (top_scores > float("-inf"))  # (n, 2K)
        normalised = top_scores / length_penalty(step + 1, alpha)  # (n, 2K)
        best_now, pick = normalised.masked_fill(~finishing, float("-inf")).max(dim=-1)  # (n,)
        improved = best_now > best_scores  # (n,)
        best_scores = torch.where(improved, best_now, best_scores)
        n_finished = n_finished + finishing.sum(dim=-1)
        done = (n_finished >= K) | at_limit  # (n,)
        improved_rows = improved.nonzero().flatten()  # (n_improved,)
        if improved_rows.numel():
            rows = origin[improved_rows, pick[improved_rows]]
            last = next_tokens[improved_rows, pick[improved_rows]]
            for i, prefix, token in zip(
                active[improved_rows].tolist(), tokens[rows, 1 : step + 1].tolist(), last.tolist()
            ):
                outputs[i] = prefix if token == eos_id else prefix + [token]
        # the K best extensions that do not end in EOS live on
        live_scores, live = top_scores.masked_fill(ends, float("-inf")).topk(K, dim=-1)  # (n, K)
        rows = origin.gather(1, live).view(-1)  # (n·K,)
        scores = live_scores.view(-1)
        tokens = tokens[rows]
        tokens[:, step + 1] = next_tokens.gather(1, live).view(-1)
        _select_rows(cache, rows, parts=("self",))  # the memory's keys/values are the same per beam
        finished_sentences = done.nonzero().flatten()
        if finished_sentences.numel() == n:
            break
        if finished_sentences.numel():  # drop the finished sentences from every tensor
            keep = (~done).nonzero().flatten()  # (n',)
            rows = (keep[:, None] * K + beams).view(-1)  # (n'·K,)
            active, limits, best_scores, n_finished = (
                t[keep] for t in (active, limits, best_scores, n_finished)
            )
            scores, tokens, memory, src_mask = (t[rows] for t in (scores, tokens, memory, src_mask))
            _select_rows(cache, rows)
    return outputs
