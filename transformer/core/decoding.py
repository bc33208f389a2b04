"""Decoding: batched greedy search and beam search with the key/value cache (§6.1). Ids in, ids out.

The encoder runs once per batch; the cross-attention keys/values of the memory are computed on the first
step and reused (see ``MultiHeadAttention``); each step feeds only the newest token. Sentences whose
search is over leave the batch, so the rest runs faster. Beam search decodes its first step once per
sentence (the K beams are all the start token) and scores a block of rows at a time (``_row_best``).

Length limit: a sentence produces at most ``source length + max_len_offset`` tokens, EOS included, where
the source length counts the source's EOS (§6.1: input length + 50), and never more than
``model.config.max_positions`` (the decoder has no position beyond). A sentence that hits the limit ends
there without EOS.

The decoder starts from ``model.start_id``: BOS, or PAD for Marian-style models
(``model.decoder_start_token: pad``); the special ids are the model's. Neither search produces PAD or the
start token: they are never training targets, and a PAD fed back would be masked by the full-prefix
decoder (``use_cache=False``) but not by the cache, so the two would disagree. EOS is never ruled out,
even when it shares an id with them. Outputs exclude the start token and EOS.

Prefix-constrained decoding: ``prefix`` (B, P) long holds, per sentence, target tokens every output must
start with (-1 where a sentence's prefix has ended). While a sentence is inside its prefix, every other token
is ruled out of its next-token distribution, after the log-softmax: the prefix's tokens are scored with
their real probabilities, and the rest is searched as usual. A sentence may produce at least its prefix and
EOS, whatever its source length.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from transformer.core.model import Cache, Transformer
from transformer.core.topk import best_index, top_k


def _select_rows(cache: Cache, rows: torch.Tensor, parts=("self", "cross")) -> None:
    """Keep (and reorder) the batch rows ``rows`` of the cached key / value tensors, in place.

    The memory's keys / values ("cross") are selected now. The past tokens' ("self") are selected when the
    next step appends its own (``attention.append_step``: one copy instead of two); until then the cache
    holds the rows to take, composed with any taken before.
    """
    for layer in cache:
        for name in parts:
            part = layer[name]
            if name == "self":
                part["rows"] = rows if "rows" not in part else part["rows"][rows]
            else:
                part["k"], part["v"] = part["k"].index_select(0, rows), part["v"].index_select(0, rows)


def _contiguous_memory_cache(cache: Cache) -> None:
    """Store the memory's keys/values contiguously (they come as views of one fused projection), so that
    the attention matmuls of every later step need not copy them."""
    for layer in cache:
        for name, tensor in layer["cross"].items():
            layer["cross"][name] = tensor.contiguous()


def max_lengths(model: Transformer, src: torch.Tensor, max_len_offset: int) -> torch.Tensor:
    """The most tokens (EOS included) each sentence may produce. src (B, S) -> (B,) long."""
    source_lengths = (src != model.pad_id).sum(dim=1)  # (B,) with the source's EOS
    return (source_lengths + max_len_offset).clamp(min=1, max=model.config.max_positions)


def ended_with_eos(
    model: Transformer, src: list[int], hyp: list[int], max_len_offset: int, prefix_length: int = 0
) -> bool:
    """THE test of whether ``hyp``, a translation of ``src`` (ids without EOS) that had to start with a
    prefix of ``prefix_length`` tokens, ended with EOS rather than at its length limit (raised to fit the
    prefix, as the searches raise it): the searches output a translation shorter than its limit only when
    EOS ended it."""
    src_tensor = torch.tensor([src + [model.eos_id]])  # (1, S)
    prefix = torch.zeros(1, prefix_length, dtype=torch.long)  # (1, P): only its length counts here
    limit = _prefix_limits(max_lengths(model, src_tensor, max_len_offset), prefix, model)  # (1,)
    return len(hyp) < int(limit[0])


def _force_prefix(scores: torch.Tensor, prefix: torch.Tensor | None, step: int) -> torch.Tensor:
    """Rows whose prefix has a token at ``step``: every other token ruled out. scores (N, V), in place."""
    if prefix is None or step >= prefix.size(1):
        return scores
    wanted = prefix[:, step]  # (N,) -1 = free
    forced = (wanted >= 0).nonzero().flatten()  # (N_forced,)
    if forced.numel():
        kept = scores[forced, wanted[forced]]  # (N_forced,)
        scores[forced] = float("-inf")
        scores[forced, wanted[forced]] = kept
    return scores


def _prefix_limits(limits: torch.Tensor, prefix: torch.Tensor | None, model: Transformer) -> torch.Tensor:
    """At least room for the prefix and EOS. limits (B,) -> (B,)."""
    if prefix is None:
        return limits
    needed = (prefix >= 0).sum(dim=1) + 1  # (B,)
    return torch.maximum(limits, needed).clamp(max=model.config.max_positions)


def _next_token_logits(logits: torch.Tensor, model: Transformer) -> torch.Tensor:
    """The last position's logits (N, T, V) -> (N, V), with PAD and the start token ruled out (not EOS)."""
    logits = logits[:, -1]  # (N, V)
    logits[:, model.never_produced] = float("-inf")
    return logits


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    max_len_offset: int,
    use_cache: bool = True,
    prefix: torch.Tensor | None = None,
    pick: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[list[int]]:
    """src (B, S) -> B token-id lists: the most probable token at every step.

    ``use_cache=False`` recomputes the whole prefix at every step (the slow reference decoder).
    ``prefix`` (B, P): see the module docstring. ``pick``: next-token logits (N, V) -> tokens (N,) in place
    of the argmax (``sampling.sample_tokens``: sampling is this same loop).
    """
    B, device = src.size(0), src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    limits = _prefix_limits(max_lengths(model, src, max_len_offset), prefix, model)  # (B,)
    L = int(limits.max())
    outputs: list[list[int]] = [[] for _ in range(B)]
    active = torch.arange(B, device=device)  # original row of each row still decoding
    eos_id = model.eos_id
    tokens = torch.full((B, L + 1), model.start_id, dtype=torch.long, device=device)  # (B_active, 1 + L)
    cache = model.new_cache() if use_cache else None
    for step in range(L):
        inputs = tokens[:, step : step + 1] if use_cache else tokens[:, : step + 1]  # (B_active, 1 | 1+t)
        logits, _, _ = model.decode(inputs, memory, src_mask, cache)  # (B_active, 1 | 1+t, V)
        if step == 0 and cache is not None:
            _contiguous_memory_cache(cache)
        logits = _force_prefix(_next_token_logits(logits, model), prefix, step)  # (B_active, V)
        next_tokens = best_index(logits) if pick is None else pick(logits)  # (B_active,)
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
        prefix = None if prefix is None else prefix[keep]
        if cache is not None:
            _select_rows(cache, keep)
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
    memory: torch.Tensor  # (n, S, D): one per sentence, its K beams attend to it together
    src_mask: torch.Tensor  # (n, 1, 1, S)
    prefix: torch.Tensor | None  # (n·K, P) the tokens each hypothesis must start with, -1 = free

    def keep(self, sentences: torch.Tensor, cache: Cache) -> None:
        """Keep only these sentences (indices into the n), here and in the cache."""
        K = self.scores.numel() // self.active.numel()
        rows = (sentences[:, None] * K + torch.arange(K, device=sentences.device)).view(-1)  # (n'·K,)
        self.active, self.limits, self.best_scores, self.n_finished, self.memory, self.src_mask = (
            t[sentences]
            for t in (self.active, self.limits, self.best_scores, self.n_finished, self.memory, self.src_mask)
        )
        self.scores, self.tokens = self.scores[rows], self.tokens[rows]
        self.prefix = None if self.prefix is None else self.prefix[rows]
        _select_rows(cache, rows, parts=("self",))  # a row per beam
        _select_rows(cache, sentences, parts=("cross",))  # a row per sentence


def _start_beams(
    model: Transformer, src: torch.Tensor, K: int, max_len_offset: int, prefix: torch.Tensor | None
) -> _Beams:
    B, device = src.size(0), src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    limits = _prefix_limits(max_lengths(model, src, max_len_offset), prefix, model)  # (B,)
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
        memory=memory,  # (B, S, D)
        src_mask=src_mask,  # (B, 1, 1, S)
        prefix=None if prefix is None else prefix.repeat_interleave(K, dim=0),  # (B·K, P)
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


# rows of next-token logits (·, V) made and scored at a time on a CPU (see _row_best; the size that
# scored fastest: docs/benchmarks.md, "Speed choices in the code")
SCORE_ROWS = 512


def _row_best(features: torch.Tensor, model: Transformer, k: int, step: int, prefix, dtype: torch.dtype):
    """Each row's k best tokens by log p: (log p in ``dtype``, token), each (N, k). features (N, 1, D),
    prefix (N, P) or None.

    On a CPU the output layer and the scoring run SCORE_ROWS rows at a time: a bounded buffer, where an
    (N, V) one would be allocated at every step, its page faults costing as much as the top-k over it; on
    a GPU, all rows at once. The log-softmax overwrites the logits: one fused pass per row, where
    ``logsumexp`` makes four passes over the block and a fresh copy of it (docs/benchmarks.md, "Speed
    choices in the code").
    """
    chunk = SCORE_ROWS if features.device.type == "cpu" else features.size(0)
    log_probs, tokens = [], []
    for start in range(0, features.size(0), chunk):
        rows = slice(start, start + chunk)
        logits = _next_token_logits(model.output_proj(features[rows]), model).to(dtype)  # (r, V)
        # in place: each row is read whole before it is written (tests/test_decoding.py pins it)
        scores = torch._log_softmax(logits, -1, False, out=logits)  # (r, V) log p
        # a forced token keeps its real probability
        scores = _force_prefix(scores, None if prefix is None else prefix[rows], step)
        best, best_tokens = top_k(scores, k)  # (r, k) each
        log_probs.append(best)
        tokens.append(best_tokens)
    return torch.cat(log_probs), torch.cat(tokens)  # (N, k) each


def _best_extensions(beams: _Beams, features: torch.Tensor, model: Transformer, step: int, first: bool):
    """The 2K best one-token extensions of each sentence's K hypotheses by log P: (scores, row extended,
    token), each (n, 2K). features (n·K, 1, D): the decoder's output; on the ``first`` step (n, 1, D), one
    row per sentence, since its K beams are all the start token.

    In two stages: each row's 2K best tokens (a sentence's 2K best extensions are among them), then the
    best 2K of those K·2K.
    """
    n, K = beams.active.numel(), beams.scores.numel() // beams.active.numel()
    k = min(2 * K, model.output_proj.out_features)  # k' = 2K, or V if smaller
    prefix = None if beams.prefix is None else beams.prefix[:: K if first else 1]  # (n | n·K, P)
    row_log_probs, row_tokens = _row_best(features, model, k, step, prefix, beams.scores.dtype)  # (·, k')
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
    prefix: torch.Tensor | None = None,
) -> list[list[int]]:
    """src (B, S) -> B token-id lists: the best finished hypothesis by log P(Y|X) / lp(|Y|).

    ``finished``: B empty lists, to receive every finished hypothesis of each sentence as (log P / lp,
    ids, log P) (see ``beam_search_nbest``). ``prefix`` (B, P): see the module docstring.

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
    K, eos_id = beam_size, model.eos_id
    beams = _start_beams(model, src, K, max_len_offset, prefix)
    outputs: list[list[int]] = [[] for _ in range(src.size(0))]
    cache = model.new_cache()
    for step in range(beams.tokens.size(1) - 1):
        # the first step decodes each sentence's start token once, not K times (as CTranslate2 does)
        inputs = beams.tokens[:: K if step == 0 else 1, step : step + 1]  # (n·K | n, 1)
        features, _, _ = model.decode(inputs, beams.memory, beams.src_mask, cache, project=False)  # (·, 1, D)
        if step == 0:
            _contiguous_memory_cache(cache)
        top_scores, origin, next_tokens = _best_extensions(beams, features, model, step, step == 0)  # (n, 2K)
        done = _finish_hypotheses(
            beams, top_scores, next_tokens, origin, step, eos_id, length_penalty, outputs, finished
        )
        # the K best extensions that do not end in EOS live on
        live_scores, live = top_scores.masked_fill(next_tokens == eos_id, float("-inf")).topk(K, dim=-1)
        rows = origin.gather(1, live).view(-1)  # (n·K,)
        beams.scores, beams.tokens = live_scores.view(-1), beams.tokens[rows]
        beams.tokens[:, step + 1] = next_tokens.gather(1, live).view(-1)
        # the memory's keys/values are the same per beam; on the first step the cache has a row per sentence
        _select_rows(cache, rows // K if step == 0 else rows, parts=("self",))
        if bool(done.all()):
            break
        if bool(done.any()):  # drop the finished sentences from every tensor
            beams.keep((~done).nonzero().flatten(), cache)
    return outputs


def beam_search_nbest(
    model: Transformer,
    src: torch.Tensor,
    beam_size: int,
    length_penalty: float,
    max_len_offset: int,
    nbest: int,
    prefix: torch.Tensor | None = None,
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
    beam_search(model, src, beam_size, length_penalty, max_len_offset, finished, prefix)
    ranked = [sorted(hyps, key=lambda h: -h[0])[:nbest] for hyps in finished]  # stable: first found wins ties
    return [[(ids, log_p) for _, ids, log_p in hyps] for hyps in ranked]
