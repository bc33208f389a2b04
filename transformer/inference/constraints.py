"""Lexical constraints (terminology): translations that contain given target phrases, anywhere in them.

    translator.translate(["Ein Hund rennt."], beam=4, constraints=[["puppy"]])
    translate.py --beam 4 --constraint puppy            # for every line
    translate.py --beam 4 --constraints FILE            # a line of tab-separated phrases per input line

The search is dynamic beam allocation (Post & Vilar, 2018), on the core's beam search state. Each hypothesis
carries its progress: how many of its sentence's constraint tokens it has produced. A phrase of several
tokens counts token by token while it is being produced, and falls back to 0 if the hypothesis leaves it
half-way. Each step, for each sentence:

1. candidates: the 2K best one-token extensions of its K hypotheses (plain beam search's), plus, for every
   hypothesis, the token that advances each constraint it may advance, plus its own best token;
2. banks: the candidates grouped by their progress, 0 ... C (all C constraint tokens produced);
3. the K hypotheses that live on are taken from the banks in rounds, best first within a bank, the most
   advanced bank first in each round: the beam is split evenly among the levels of progress, the most
   advanced bank gets the rest, and a bank short of candidates leaves its places to the others.

    progress   3 (all met)   2      1      0
    round 1    a1            b1     c1     d1        K = 6: a1 b1 c1 d1 a2 b2
    round 2    a2            b2     (c2)   (d2)

EOS is ruled out until a hypothesis has produced every constraint; an extension by EOS among the K best of
the most advanced bank finishes. A sentence ends when K hypotheses have finished, or at its length limit,
which leaves room for the constraints' tokens beyond the source-based one (``Constraints.limits``). At the
limit the hypotheses finish as they are; the best one that met every constraint wins, else the best of the
rest, reported with ``met`` False: never dropped, never padded.
"""

from dataclasses import dataclass

import torch

from transformer.core.decoding import (
    Steering,
    _Beams,
    _start_beams,
    best_token,
    length_normaliser,
    next_token_logits,
)
from transformer.core.model import Transformer

# Greedy decoding with constraints runs the constrained search with this beam: one place per level of
# progress for up to three constraint tokens.
GREEDY_BEAM = 4


@dataclass
class Constraints(Steering):
    """The constraint phrases of a batch's sentences and each hypothesis's progress through them.

    A ``Steering`` of the core's searches: the length limits leave room for the phrases, EOS is ruled out
    until every phrase is produced, and the progress follows the hypotheses as they are kept."""

    phrases: torch.Tensor  # (B, C, L) long: sentence b's phrase c, padded with -1 (no phrase: all -1)
    lengths: torch.Tensor  # (B, C) tokens of each phrase (0: none)
    eos_id: int
    max_positions: int  # the model's: no length limit passes it
    sentence: torch.Tensor  # (N,) each hypothesis's sentence (a row of ``phrases``)
    met: torch.Tensor  # (N, C) bool: phrases produced (a missing phrase counts as produced)
    partial: torch.Tensor  # (N,) the phrase being produced, -1 for none
    depth: torch.Tensor  # (N,) its tokens produced so far

    @classmethod
    def of(cls, phrases: list[list[list[int]]], eos_id: int, max_positions: int, device) -> "Constraints":
        """Per sentence, its phrases (each a non-empty list of target ids) -> the progress of one empty
        hypothesis per sentence."""
        B, C = len(phrases), max([1] + [len(p) for p in phrases])
        L = max([1] + [len(phrase) for sentence in phrases for phrase in sentence])
        table = torch.full((B, C, L), -1, dtype=torch.long)
        for b, sentence in enumerate(phrases):
            for c, phrase in enumerate(sentence):
                table[b, c, : len(phrase)] = torch.tensor(phrase)
        table = table.to(device)
        lengths = (table >= 0).sum(dim=-1)  # (B, C)
        none = torch.full((B,), -1, device=device)
        return cls(
            table,
            lengths,
            eos_id,
            max_positions,
            torch.arange(B, device=device),
            lengths == 0,
            none,
            none + 1,
        )

    @property
    def needed(self) -> torch.Tensor:
        """(B,) the constraint tokens of each sentence."""
        return self.lengths.sum(dim=1)

    def progress(self, met: torch.Tensor, depth: torch.Tensor, sentence: torch.Tensor) -> torch.Tensor:
        """(M,) constraint tokens produced: those of the phrases met, and of the one under way."""
        return (self.lengths[sentence] * met).sum(dim=1) + depth

    def limits(self, limits: torch.Tensor) -> torch.Tensor:
        """Room for the constraints' tokens beyond the source-based limits. (B,) -> (B,)."""
        return (limits + self.needed.to(limits.device)).clamp(max=self.max_positions)

    def restrict(self, scores: torch.Tensor, step: int, rows: torch.Tensor) -> torch.Tensor:
        """EOS ruled out for the hypotheses ``rows`` that have not produced every phrase. scores (N, V)."""
        unmet = ~self.met[rows].all(dim=1) | (self.partial[rows] >= 0)  # (N,)
        scores[unmet, self.eos_id] = float("-inf")
        return scores

    def keep(self, rows: torch.Tensor) -> None:
        self.sentence, self.met, self.partial, self.depth = (
            t[rows] for t in (self.sentence, self.met, self.partial, self.depth)
        )

    def advancing_tokens(self) -> torch.Tensor:
        """(N, C) per hypothesis and phrase, the token that advances the phrase (-1: none): the next one of
        the phrase under way, else the first one of each phrase not yet met."""
        phrases = self.phrases[self.sentence]  # (N, C, L)
        L = phrases.size(2)
        under_way = self.partial >= 0  # (N,)
        wanted = phrases[:, :, 0].masked_fill(self.met | under_way[:, None], -1)  # (N, C)
        rows = under_way.nonzero().flatten()  # (N_under_way,)
        under = self.partial[rows]
        wanted[rows, under] = phrases[rows, under, self.depth[rows].clamp(max=L - 1)]
        return wanted

    def advanced(self, rows: torch.Tensor, tokens: torch.Tensor):
        """The progress of hypotheses ``rows`` (M,) each extended by its token (M,): (met (M, C), partial
        (M,), depth (M,)). A token that does not continue the phrase under way drops it (and may start
        another); a token that starts no phrase not yet met changes nothing."""
        met, partial, depth = self.met[rows].clone(), self.partial[rows], self.depth[rows]
        phrases, lengths = self.phrases[self.sentence[rows]], self.lengths[self.sentence[rows]]  # (M, C, L)
        M, L = phrases.size(0), phrases.size(2)
        m, under = torch.arange(M, device=rows.device), partial.clamp(min=0)
        continues = (partial >= 0) & (tokens == phrases[m, under, depth.clamp(max=L - 1)])  # (M,)
        completes = continues & (depth + 1 == lengths[m, under])  # (M,)
        met[m[completes], under[completes]] = True
        partial = torch.where(continues & ~completes, partial, -1)
        depth = torch.where(partial >= 0, depth + 1, 0)
        starts = (phrases[:, :, 0] == tokens[:, None]) & ~met  # (M, C) phrases this token begins
        starting = ~continues & starts.any(dim=1)  # (M,)
        first = starts.float().argmax(dim=1)  # (M,) the first phrase it begins
        whole = starting & (lengths[m, first] == 1)
        met[m[whole], first[whole]] = True
        begun = starting & ~whole
        return met, torch.where(begun, first, partial), torch.where(begun, 1, depth)


class Together(Steering):
    """Several steerings at once (a prefix and constraints): limits, restrictions and rows in turn."""

    def __init__(self, *parts: Steering):
        self.parts = parts

    def limits(self, limits: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            limits = part.limits(limits)
        return limits

    def restrict(self, scores: torch.Tensor, step: int, rows: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            scores = part.restrict(scores, step, rows)
        return scores

    def keep(self, rows: torch.Tensor) -> None:
        for part in self.parts:
            part.keep(rows)


def _candidates(beams: _Beams, log_probs: torch.Tensor, constraints: Constraints, K: int):
    """Each sentence's candidates (step 1 of the module docstring): (log P, hypothesis extended, token),
    each (n, M); a repeated (hypothesis, token) pair and a missing token score -inf."""
    n, V = beams.active.numel(), log_probs.size(1)
    total = beams.scores[:, None] + log_probs  # (n·K, V) log P of every extension
    best_scores, best = total.view(n, -1).topk(2 * K, dim=-1)  # (n, 2K)
    rows = torch.arange(n * K, device=log_probs.device)  # (n·K,)
    wanted = constraints.advancing_tokens()  # (n·K, C)
    origin = torch.cat(
        [best // V + (rows[::K])[:, None], rows[:, None].expand_as(wanted).reshape(n, -1), rows.view(n, K)], 1
    )  # (n, M)
    tokens = torch.cat([best % V, wanted.reshape(n, -1), best_token(log_probs).view(n, K)], 1)  # (n, M)
    scores = total[origin, tokens.clamp(min=0)].masked_fill(tokens < 0, float("-inf"))  # (n, M)
    keys, order = (origin * V + tokens.clamp(min=0)).sort(dim=1, stable=True)  # (n, M)
    repeated = torch.zeros_like(keys, dtype=torch.bool)
    repeated[:, 1:] = keys[:, 1:] == keys[:, :-1]
    return scores.masked_fill(repeated.gather(1, order.argsort(dim=1)), float("-inf")), origin, tokens


def _allocate(scores: torch.Tensor, progress: torch.Tensor, K: int) -> torch.Tensor:
    """The K candidates that live on (step 3 of the module docstring): indices (n, K) into the candidates.
    scores, progress (n, M); a candidate scored -inf is taken last."""
    by_score = scores.argsort(dim=1, descending=True, stable=True)  # (n, M)
    order = by_score.gather(1, progress.gather(1, by_score).argsort(dim=1, descending=True, stable=True))
    banks = progress.gather(1, order)  # (n, M) banks, most advanced first, best first within each
    position = torch.arange(order.size(1), device=scores.device).expand_as(order)  # (n, M)
    opens = torch.ones_like(order, dtype=torch.bool)
    opens[:, 1:] = banks[:, 1:] != banks[:, :-1]
    rank = position - torch.where(opens, position, 0).cummax(dim=1).values  # (n, M) rank within the bank
    levels = int(banks.max()) + 1
    key = (rank * levels + (levels - 1 - banks)).masked_fill(
        scores.gather(1, order) == float("-inf"), 1 << 40
    )
    return order.gather(1, key.topk(K, dim=1, largest=False).indices)  # (n, K)


@dataclass
class _Found:
    """What a sentence has found so far: its best finished hypothesis (one that met every constraint beats
    any that did not), and how many have finished."""

    outputs: list  # per original sentence: the best finished hypothesis's ids
    met: list  # per original sentence: whether it produced every constraint
    best: torch.Tensor  # (n,) log P / lp of the best finished hypothesis, -inf for none
    best_met: torch.Tensor  # (n,) bool
    finished: list | None = None  # per original sentence, every finished (log P / lp, ids, log P, met)

    def offer(self, beams: _Beams, scores, met, origin, tokens, finishing, step: int, eos_id: int, alpha):
        """The finishing candidates (n, M) bool: each sentence's best of them replaces its best so far if
        better (scores: log P, met: whether they produced every constraint)."""
        normalised = scores / length_normaliser(step + 1, alpha)  # (n, M)
        if self.finished is not None:
            self.collect(beams, normalised, scores, met, origin, tokens, finishing, step, eos_id)
        key = normalised.masked_fill(~finishing, float("-inf"))  # (n, M)
        # a hypothesis that met every constraint ranks above every one that did not
        ranked = torch.where(met & finishing, 1, torch.where(finishing, 0, -1))  # (n, M)
        level, _ = ranked.max(dim=1)  # (n,)
        now, pick = key.masked_fill(ranked < level[:, None], float("-inf")).max(dim=1)  # (n,)
        now_met = level == 1
        better = (level >= 0) & (
            (now_met & ~self.best_met) | ((now_met == self.best_met) & (now > self.best))
        )
        self.best = torch.where(better, now, self.best)
        self.best_met = torch.where(better, now_met, self.best_met)
        sentences = better.nonzero().flatten()  # (n_better,)
        rows, last = origin[sentences, pick[sentences]], tokens[sentences, pick[sentences]]
        for i, s, prefix, token in zip(
            beams.active[sentences].tolist(), sentences.tolist(), beams.tokens[rows, 1 : step + 1].tolist(),
            last.tolist(),
        ):  # fmt: skip
            self.outputs[i] = prefix if token == eos_id else prefix + [token]
            self.met[i] = bool(self.best_met[s])

    def collect(
        self, beams: _Beams, normalised, scores, met, origin, tokens, finishing, step: int, eos_id: int
    ):
        """Every finishing candidate into its sentence's ``finished`` list, in row-major order (as
        ``core.decoding._collect_finished``: a stable sort then breaks ties as ``offer`` does)."""
        sentences, ranks = finishing.nonzero(as_tuple=True)  # (n_finishing,) each
        rows = origin[sentences, ranks]
        for i, prefix, token, norm, log_p, ok in zip(
            beams.active[sentences].tolist(), beams.tokens[rows, 1 : step + 1].tolist(),
            tokens[sentences, ranks].tolist(), normalised[sentences, ranks].tolist(),
            scores[sentences, ranks].tolist(), met[sentences, ranks].tolist(),
        ):  # fmt: skip
            self.finished[i].append((norm, prefix if token == eos_id else prefix + [token], log_p, ok))

    def keep(self, sentences: torch.Tensor) -> None:
        self.best, self.best_met = self.best[sentences], self.best_met[sentences]


@torch.no_grad()
def constrained_beam_search(
    model: Transformer,
    src: torch.Tensor,
    beam_size: int,
    length_penalty: float,
    max_len_offset: int,
    constraints: list[list[list[int]]],
    steering: Steering | None = None,
    finished: list[list[tuple[float, list[int], float, bool]]] | None = None,
) -> tuple[list[list[int]], list[bool]]:
    """src (B, S) -> (B token-id lists, B flags): the best hypothesis that contains every phrase of its
    sentence's ``constraints`` (each phrase a list of target ids), by log P(Y|X) / lp(|Y|) as beam search
    ranks them, and whether it does (False: none did within the length limit; the best of the rest).
    ``steering``: another one (a prefix) applied as well. ``finished``: B empty lists, to receive every
    finished hypothesis as (log P / lp, ids, log P, met), in the order found (``constrained_nbest``)."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    K, eos_id, device = beam_size, model.eos_id, src.device
    wanted = Constraints.of(constraints, eos_id, model.config.max_positions, device)
    steer = wanted if steering is None else Together(steering, wanted)
    beams = _start_beams(model, src, K, max_len_offset, steer, False)
    B, dtype = src.size(0), beams.scores.dtype
    found = _Found([[] for _ in range(B)], [False] * B, torch.full((B,), float("-inf"), dtype=dtype,
                   device=device), torch.zeros(B, dtype=torch.bool, device=device), finished)  # fmt: skip
    cache = model.new_cache()
    for step in range(beams.tokens.size(1) - 1):
        features, _, _ = model.decode(beams.tokens[:, step : step + 1], beams.memory, beams.src_mask, cache,
                                      project=False)  # fmt: skip
        log_probs = torch.log_softmax(next_token_logits(model, features).to(dtype), dim=-1)  # (n·K, V)
        log_probs = steer.restrict(log_probs, step, torch.arange(log_probs.size(0), device=device))
        done = _step(beams, found, wanted, steer, cache, model, log_probs, step, eos_id, length_penalty)
        if bool(done.all()):
            break
        if bool(done.any()):  # drop the finished sentences from every tensor
            kept = (~done).nonzero().flatten()
            beams.keep(kept, cache, model, steer)
            found.keep(kept)
    return found.outputs, found.met


def _step(beams, found, wanted: Constraints, steer, cache, model, log_probs, step, eos_id, alpha):
    """One step of the search for every sentence still decoding: finish, allocate, extend. -> done (n,)."""
    n, K = beams.active.numel(), beams.scores.numel() // beams.active.numel()
    scores, origin, tokens = _candidates(beams, log_probs, wanted, K)  # (n, M) each
    met, partial, depth = wanted.advanced(origin.view(-1), tokens.view(-1).clamp(min=0))
    sentence = wanted.sentence[origin.view(-1)]
    progress = wanted.progress(met, depth, sentence).view(n, -1)  # (n, M)
    complete = progress == wanted.needed[sentence].view(n, -1)  # (n, M) every constraint produced
    at_limit = step + 1 >= beams.limits  # (n,)
    ends = (tokens == eos_id) & (scores > float("-inf"))  # (n, M)
    top = scores.masked_fill(~complete, float("-inf")).topk(min(K, scores.size(1)), dim=1).values[:, -1:]
    finishing = ends & (scores >= top)  # among the K best of the complete ones
    live = _allocate(scores.masked_fill(ends, float("-inf")), progress, K)  # (n, K)
    at_limit_live = torch.zeros_like(finishing).scatter(1, live, True) & at_limit[:, None]
    finishing = finishing | (at_limit_live & (scores > float("-inf")))
    found.offer(beams, scores, complete, origin, tokens, finishing, step, eos_id, alpha)
    beams.n_finished = beams.n_finished + (ends & finishing).sum(dim=1)
    rows = origin.gather(1, live).view(-1)  # (n·K,) the hypotheses extended
    chosen = (live + torch.arange(n, device=live.device)[:, None] * origin.size(1)).view(-1)  # into (n·M,)
    beams.scores = scores.masked_fill(ends, float("-inf")).gather(1, live).view(-1)
    beams.tokens = beams.tokens[rows]
    beams.tokens[:, step + 1] = tokens.gather(1, live).view(-1).clamp(min=0)  # a dead beam's: any id
    model.select_cache_rows(cache, rows)  # each row stays with its sentence: the memory's rows as they are
    steer.keep(rows)
    wanted.met, wanted.partial, wanted.depth = met[chosen], partial[chosen], depth[chosen]
    return (beams.n_finished >= K) | at_limit


def constrained_nbest(
    model: Transformer, src: torch.Tensor, beam_size: int, length_penalty: float, max_len_offset: int,
    constraints: list[list[list[int]]], nbest: int, steering: Steering | None = None,
) -> list[list[tuple[list[int], float, bool]]]:  # fmt: skip
    """src (B, S) -> per sentence, its ``nbest`` best finished hypotheses as (ids, log P(Y|X), met), those
    that hold every phrase first, each group by log P / lp; the first is ``constrained_beam_search``'s."""
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be in [1, beam_size={beam_size}], got {nbest}")
    finished: list[list[tuple[float, list[int], float, bool]]] = [[] for _ in range(src.size(0))]
    search = (model, src, beam_size, length_penalty, max_len_offset, constraints, steering)
    constrained_beam_search(*search, finished)
    ranked = [sorted(hyps, key=lambda h: (not h[3], -h[0]))[:nbest] for hyps in finished]  # stable
    return [[(ids, log_p, met) for _, ids, log_p, met in hyps] for hyps in ranked]
