"""Decoding: batched greedy search and beam search with the key/value cache (§6.1). Ids in, ids out.

The encoder runs once per batch; the cross-attention keys/values of the memory are computed on the first
step and reused (see ``MultiHeadAttention``); each step feeds only the newest token. Sentences whose
search is over leave the batch, so the rest runs faster.

Length limit: a sentence produces at most ``source length + max_len_offset`` tokens, EOS included, where
the source length counts the source's EOS (§6.1: input length + 50), and never more than
``model.config.max_positions`` (the decoder has no position beyond). A sentence that hits the limit ends
there without EOS.

The decoder starts from ``model.start_id``; the special ids are the model's. Neither search produces PAD or
the start token: they are never training targets, and a PAD fed back would be masked by the full-prefix
decoder (``use_cache=False``) but not by the cache, so the two would disagree. EOS is never ruled out,
even when it shares an id with them. Outputs exclude the start token and EOS.

Two seams let other code extend a search without copying it:
- ``Steering``: a search asks it for the length limits and lets it rule tokens out of the next-token scores;
  it is told how the search drops and reorders its rows (forced prefixes are one);
- ``Kernels``: beam search's inner operation, each row's best extensions (the output layer, log-softmax
  and top-k), in plain PyTorch here; a faster one that computes the same can replace it.
The cache's layout belongs to the attention modules (``Transformer.select_cache_rows``), so a faster
attention module that keeps its cache otherwise comes with the model, not with the search.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from transformer.core.model import Cache, Transformer


class Steering:
    """What a search lets its caller change; this one changes nothing. Rows are the search's hypotheses
    (greedy: one per sentence; beam search: K per sentence, sentence-major)."""

    def limits(self, limits: torch.Tensor) -> torch.Tensor:
        """The most tokens (EOS included) each sentence may produce: (B,) -> (B,)."""
        return limits

    def restrict(self, scores: torch.Tensor, step: int, rows: torch.Tensor) -> torch.Tensor:
        """Next-token scores (N, V) of the hypotheses ``rows`` (N,) at ``step``, with tokens ruled out
        (-inf) or not; in place allowed."""
        return scores

    def keep(self, rows: torch.Tensor) -> None:
        """The search's hypotheses are now its former ones ``rows`` (reordered, repeated or dropped)."""


class Kernels:
    """Beam search's inner operation in plain PyTorch; a faster one that gives the same results can replace
    it (the module docstring)."""

    def row_best(self, features, model: Transformer, k: int, dtype: torch.dtype, restrict=None):
        """Each row's k best next tokens by log p: (log p in ``dtype``, token), each (N, k), from the
        decoder's features (N, 1, D); ``restrict`` (log p (n, V), rows: a slice of the N) rules tokens out."""
        log_probs = torch.log_softmax(next_token_logits(model, features).to(dtype), dim=-1)  # (N, V)
        if restrict is not None:
            log_probs = restrict(log_probs, slice(None))
        return log_probs.topk(k, dim=-1)  # (N, k) each


PLAIN = Kernels()


def best_token(scores: torch.Tensor) -> torch.Tensor:
    """scores (N, V) -> (N,) long: the index of each row's largest score, the first of equal ones (so a
    tie never changes a translation), as ``argmax``; ``max`` finds the same index faster on the CPU
    (docs/benchmarks.md, "Speed choices in the code")."""
    return scores.max(dim=-1).indices  # (N,)


def next_token_logits(model: Transformer, features: torch.Tensor) -> torch.Tensor:
    """The last position's features (N, T, D) -> its logits (N, V), PAD and the start token ruled out."""
    logits = model.output_proj(features[:, -1])  # (N, V)
    logits[:, model.never_produced] = float("-inf")
    return logits


def max_lengths(model: Transformer, src: torch.Tensor, max_len_offset: int) -> torch.Tensor:
    """The most tokens (EOS included) each sentence may produce. src (B, S) -> (B,) long."""
    source_lengths = (src != model.pad_id).sum(dim=1)  # (B,) with the source's EOS
    return (source_lengths + max_len_offset).clamp(min=1, max=model.config.max_positions)


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    max_len_offset: int,
    use_cache: bool = True,
    steering: Steering | None = None,
    choose: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[list[int]]:
    """src (B, S) -> B token-id lists: the most probable token at every step.

    ``use_cache=False`` recomputes the whole prefix at every step (the slow reference decoder).
    ``steering``: see the module docstring. ``choose``: next-token logits (N, V) -> tokens (N,) in place of
    the most probable (a sampler: sampling is this same loop).
    """
    B, device, steer = src.size(0), src.device, steering or Steering()
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    limits = steer.limits(max_lengths(model, src, max_len_offset))  # (B,)
    L = int(limits.max())
    outputs: list[list[int]] = [[] for _ in range(B)]
    active = torch.arange(B, device=device)  # original row of each row still decoding
    eos_id = model.eos_id
    tokens = torch.full((B, L + 1), model.start_id, dtype=torch.long, device=device)  # (B_active, 1 + L)
    cache = model.new_cache() if use_cache else None
    for step in range(L):
        inputs = tokens[:, step : step + 1] if use_cache else tokens[:, : step + 1]  # (B_active, 1 | 1+t)
        features, _, _ = model.decode(inputs, memory, src_mask, cache, project=False)  # (B_active, ·, D)
        logits = next_token_logits(model, features)  # (B_active, V)
        if steering is not None:  # (no per-step work for a search without one)
            logits = steering.restrict(logits, step, torch.arange(logits.size(0), device=device))
        next_tokens = best_token(logits) if choose is None else choose(logits)  # (B_active,)
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
        steer.keep(keep)
        if cache is not None:
            model.select_cache_rows(cache, keep, memory_rows=keep)
    return outputs


def length_normaliser(length, length_penalty: float):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α with α = ``length_penalty``: beam search ranks finished
    hypotheses by log P(Y|X) / lp(Y) (§6.1). |Y| counts the EOS token when there is one. ``length``: a
    number or a tensor.
    """
    return ((5.0 + length) / 6.0) ** length_penalty


@dataclass
class _Beams:
    """The search state of the sentences still decoding: n sentences, K beams each, rows sentence-major
    (rows b·K ... b·K + K - 1 are sentence b's beams)."""

    active: torch.Tensor  # (n,) original sentence of each block of K rows
    limits: torch.Tensor  # (n,) most tokens a hypothesis may have, EOS included
    best_scores: torch.Tensor  # (n,) log P / lp of the best finished hypothesis
    n_finished: torch.Tensor  # (n,) finished hypotheses so far
    scores: torch.Tensor  # (n·K,) log P of each live hypothesis
    tokens: torch.Tensor  # (n·K, 1 + L) BOS + the tokens so far
    memory: torch.Tensor  # (n·K, S, D), or (n, S, D) when a sentence's K beams share it
    src_mask: torch.Tensor  # (n·K | n, 1, 1, S)
    shared: bool  # the memory (and its cached keys / values) has one row per sentence

    def keep(self, sentences: torch.Tensor, cache: Cache, model: Transformer, steer: Steering) -> None:
        """Keep only these sentences (indices into the n), here, in the cache and in the steering."""
        K = self.scores.numel() // self.active.numel()
        rows = (sentences[:, None] * K + torch.arange(K, device=sentences.device)).view(-1)  # (n'·K,)
        memory_rows = sentences if self.shared else rows
        self.active, self.limits, self.best_scores, self.n_finished = (
            t[sentences] for t in (self.active, self.limits, self.best_scores, self.n_finished)
        )
        self.memory, self.src_mask = self.memory[memory_rows], self.src_mask[memory_rows]
        self.scores, self.tokens = self.scores[rows], self.tokens[rows]
        model.select_cache_rows(cache, rows, memory_rows)  # a row per beam; per sentence if shared
        steer.keep(rows)


def _start_beams(model: Transformer, src: torch.Tensor, K: int, max_len_offset: int, steer, shared) -> _Beams:
    B, device = src.size(0), src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    if not shared:  # each beam its own copy of its sentence's memory
        memory, src_mask = memory.repeat_interleave(K, dim=0), src_mask.repeat_interleave(K, dim=0)
    limits = steer.limits(max_lengths(model, src, max_len_offset))  # (B,)
    steer.keep(torch.arange(B, device=device).repeat_interleave(K))  # K hypotheses per sentence
    dtype = torch.promote_types(model.decoder.embedding.weight.dtype, torch.float32)  # of the scores
    scores = torch.full((B, K), float("-inf"), dtype=dtype, device=device)
    scores[:, 0] = 0.0  # all K beams start as the same BOS hypothesis: keep only one of them alive
    return _Beams(
        active=torch.arange(B, device=device),
        limits=limits,
        best_scores=torch.full((B,), float("-inf"), dtype=dtype, device=device),
        n_finished=torch.zeros(B, dtype=torch.long, device=device),
        scores=scores.view(-1),  # (B·K,)
        tokens=torch.full((B * K, int(limits.max()) + 1), model.start_id, dtype=torch.long, device=device),
        memory=memory,
        src_mask=src_mask,
        shared=shared,
    )


def _finish_hypotheses(
    beams: _Beams, top_scores, next_tokens, origin, step: int, eos_id: int, length_penalty: float, outputs,
    finished: list[list[tuple[float, list[int], float]]] | None = None,
) -> torch.Tensor:  # fmt: skip
    """Finish the extensions that end in EOS (or reach the limit) among the K best of the 2K; keep each
    sentence's best in ``outputs`` and, given ``finished``, every finished hypothesis as (log P / lp, ids,
    log P) in the order found. top_scores / next_tokens / origin (n, 2K). Returns done (n,) bool."""
    K = top_scores.size(1) // 2
    first_k = torch.arange(2 * K, device=top_scores.device) < K  # (2K,)
    at_limit = step + 1 >= beams.limits  # (n,) all hypotheses have step + 1 tokens now
    ends = next_tokens == eos_id  # (n, 2K)
    finishing = (ends | at_limit[:, None]) & first_k & (top_scores > float("-inf"))  # (n, 2K)
    normalised = top_scores / length_normaliser(step + 1, length_penalty)  # (n, 2K)
    best_now, pick = normalised.masked_fill(~finishing, float("-inf")).max(dim=-1)  # (n,)
    improved = best_now > beams.best_scores  # (n,)
    beams.best_scores = torch.where(improved, best_now, beams.best_scores)
    beams.n_finished = beams.n_finished + finishing.sum(dim=-1)
    if finished is not None:
        _collect_finished(
            beams, finishing, normalised, top_scores, next_tokens, origin, step, eos_id, finished
        )
    improved_rows = improved.nonzero().flatten()  # (n_improved,)
    if improved_rows.numel():
        rows = origin[improved_rows, pick[improved_rows]]
        last = next_tokens[improved_rows, pick[improved_rows]]
        for i, prefix, token in zip(
            beams.active[improved_rows].tolist(), beams.tokens[rows, 1 : step + 1].tolist(), last.tolist()
        ):
            outputs[i] = prefix if token == eos_id else prefix + [token]
    return (beams.n_finished >= K) | at_limit  # (n,)


def _collect_finished(
    beams: _Beams, finishing, normalised, top_scores, next_tokens, origin, step, eos_id, finished
):
    """Append every finishing extension to its sentence's list in ``finished``: row-major order (earlier
    steps first, then by rank), so that a stable sort by score breaks ties as ``outputs`` does."""
    sentences, ranks = finishing.nonzero(as_tuple=True)  # (n_finishing,) each
    rows = origin[sentences, ranks]  # (n_finishing,) the hypothesis each one extends
    for i, prefix, token, norm, log_p in zip(
        beams.active[sentences].tolist(),
        beams.tokens[rows, 1 : step + 1].tolist(),
        next_tokens[sentences, ranks].tolist(),
        normalised[sentences, ranks].tolist(),
        top_scores[sentences, ranks].tolist(),
    ):
        finished[i].append((norm, prefix if token == eos_id else prefix + [token], log_p))


def _best_extensions(beams: _Beams, features, model, step: int, first: bool, kernels: Kernels, steering):
    """The 2K best one-token extensions of each sentence's K hypotheses by log P: (scores, row extended,
    token), each (n, 2K). features (n·K, 1, D): the decoder's output; when ``first`` (n, 1, D), one row
    per sentence, since its K beams are all the start token.

    In two stages: each row's 2K best tokens (a sentence's 2K best extensions are among them), then the
    best 2K of those K·2K.
    """
    n, K = beams.active.numel(), beams.scores.numel() // beams.active.numel()
    k = min(2 * K, model.output_proj.out_features)  # k' = 2K, or V if smaller
    restrict = None
    if steering is not None:
        hypotheses = torch.arange(0, n * K, K if first else 1, device=features.device)  # of each row

        def restrict(log_probs: torch.Tensor, rows: slice) -> torch.Tensor:
            return steering.restrict(log_probs, step, hypotheses[rows])

    row_log_probs, row_tokens = kernels.row_best(features, model, k, beams.scores.dtype, restrict)  # (·, k')
    if first:  # one row per sentence scored: the same scores for its K beams (only the first one is alive)
        row_log_probs, row_tokens = row_log_probs.repeat_interleave(K, 0), row_tokens.repeat_interleave(K, 0)
    candidates = (beams.scores[:, None] + row_log_probs).view(n, -1)  # (n, K·k') log P
    top_scores, top = candidates.topk(2 * K, dim=-1)  # (n, 2K)
    origin = top // row_tokens.size(-1) + (torch.arange(n, device=features.device) * K)[:, None]  # (n, 2K)
    return top_scores, origin, row_tokens.view(n, -1).gather(1, top)


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: torch.Tensor,
    beam_size: int,
    length_penalty: float,
    max_len_offset: int,
    finished: list[list[tuple[float, list[int], float]]] | None = None,
    steering: Steering | None = None,
    kernels: Kernels = PLAIN,
) -> list[list[int]]:
    """src (B, S) -> B token-id lists: the best finished hypothesis by log P(Y|X) / lp(|Y|).

    ``finished``: B empty lists, to receive every finished hypothesis of each sentence as (log P / lp,
    ids, log P), in the order found (an n-best list). ``steering``, ``kernels``: see the module docstring.

    Each sentence keeps K live hypotheses. Every step takes the 2K best one-token extensions by log P
    (at most K of them end in EOS, so K others can live on): an extension ending in EOS that ranks among
    the first K is finished and scored by log P / lp(|Y|); the K best that do not end in EOS live on.
    A sentence is done when it has K finished hypotheses, or at its length limit (where the K best
    extensions are finished as they are). As in fairseq; with K = 1 this is exactly greedy search.

    Beam search is not exact: it may prune the prefix of a better hypothesis (even greedy's). When K is
    at least the number of extensions there are, nothing is pruned and it finds the best hypothesis.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    K, eos_id, steer = beam_size, model.eos_id, steering or Steering()
    shared = all(layer.cross_attn.beams_share_memory for layer in model.decoder.layers)
    beams = _start_beams(model, src, K, max_len_offset, steer, shared)
    outputs: list[list[int]] = [[] for _ in range(src.size(0))]
    cache = model.new_cache()
    for step in range(beams.tokens.size(1) - 1):
        # with a shared memory, the first step decodes each sentence's start token once, not K times
        first = step == 0 and beams.shared
        inputs = beams.tokens[:: K if first else 1, step : step + 1]  # (n·K | n, 1)
        features, _, _ = model.decode(inputs, beams.memory, beams.src_mask, cache, project=False)  # (·, 1, D)
        top_scores, origin, next_tokens = _best_extensions(
            beams, features, model, step, first, kernels, steering
        )
        done = _finish_hypotheses(
            beams, top_scores, next_tokens, origin, step, eos_id, length_penalty, outputs, finished
        )
        # the K best extensions that do not end in EOS live on
        live_scores, live = top_scores.masked_fill(next_tokens == eos_id, float("-inf")).topk(K, dim=-1)
        rows = origin.gather(1, live).view(-1)  # (n·K,)
        beams.scores, beams.tokens = live_scores.view(-1), beams.tokens[rows]
        beams.tokens[:, step + 1] = next_tokens.gather(1, live).view(-1)
        model.select_cache_rows(cache, rows // K if first else rows)
        steer.keep(rows)
        if bool(done.all()):
            break
        if bool(done.any()):  # drop the finished sentences from every tensor
            beams.keep((~done).nonzero().flatten(), cache, model, steer)
    return outputs
