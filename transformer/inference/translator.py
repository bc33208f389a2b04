"""The Python API: a trained model as a translator of text. ``translate.py`` is a command line over it.

    from transformer import Translator
    t = Translator.from_checkpoint("runs/multi30k_de_en/best.pt", device="cpu")
    t.translate(["Ein Hund läuft."], beam=4)                    # ["A dog is running."]
    t.translate(sentences, beam=4, nbest=3, with_scores=True)   # per input: [(text, log-prob), ...]
    t.translate(sentences, prefix=["Ein", ""])                   # outputs that start with a given prefix
    t.translate(sentences, sampling=Sampling(top_p=0.9, seed=1))  # sampled (back-translation)
    t.score(sources, references)                                # per pair: log P(reference | source)
    t.attention("Ein Hund läuft.")                              # weights per layer and head + labels
    t.alignments("Ein Hund läuft.", "A dog is running.")        # [(source word i, target word j), ...]
    t.translate(["A dog runs."], target_lang="fr")               # a multilingual model: its target

A ``Translator`` is made of (model, tokenizer, evaluation settings, device, precision); ``from_checkpoint``
reads any model ``translate.py`` takes (``interop/formats.py``). Every method works on text; the
``*_ids`` methods under them work on token ids. It is the user-facing decoding API: ``translate.py``, the
benches and the Python API decode through ``search`` / ``search_nbest``, score through
``sequence_log_probs`` and look at attention through ``attention_ids``. Its searches are the core's
(``core/decoding.py``, batched by ``runtime/search.py``, as validation and the final test decode; with the
fast tier's modules and kernels unless ``fast=False``), with what only inference needs on top: precisions
and int8, prefixes (``prefix.py``), sampling, n-best lists.

The line contract of ``translate.py`` holds here too:
  - a blank source is not run through the model: its translation is "" with log-prob 0.0, its score 0.0
    over 0 tokens, no attention, no alignment;
  - a source longer than ``max_source_tokens`` (a reference longer than ``max_target_tokens``) is truncated,
    with a warning (``warn``: by default a line on stderr);
  - log-probs are natural logs, summed over the target's tokens and its EOS (a translation stopped at the
    length limit has no EOS: summed over its tokens).
"""

import dataclasses
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

from transformer.core.batches import iter_batches, make_batches, restore_order
from transformer.core.checkpoint import CheckpointError
from transformer.core.config import EvalConfig
from transformer.core.decoding import beam_search, greedy_decode, length_normaliser
from transformer.core.model import Transformer
from transformer.core.tokenizer import Tokenizer
from transformer.fast.search import FAST
from transformer.inference.alignment import word_alignment
from transformer.inference.constraints import GREEDY_BEAM, Constraints, Together, constrained_nbest
from transformer.inference.nbest import beam_search_nbest
from transformer.inference.prefix import Prefix
from transformer.inference.quantize import quantized_decoding_model
from transformer.inference.sampling import Sampling, sample_tokens
from transformer.interop.formats import is_released, load_model, target_tokenizer
from transformer.runtime.attention_maps import SentenceAttention, pair_attention
from transformer.runtime.configs import source_token_limit
from transformer.runtime.corpora import target_languages, trained_target
from transformer.runtime.metrics import bleu_chrf
from transformer.runtime.precision import autocast, faster_precision, resolve_device, slow_precision
from transformer.runtime.search import decode_in_batches, ended_with_eos, kernels_for


def warn(message: str) -> None:
    """The default warning: one line on stderr (the command line's too)."""
    print(f"warning: {message}", file=sys.stderr)


class Hypothesis(NamedTuple):
    ids: list[int]  # target token ids, without EOS
    log_prob: float  # log P(ids [+ EOS] | source), natural log
    ended: bool  # ended with EOS (False: stopped at the length limit)
    score: float = float("nan")  # what beam search ranks by: log_prob / lp(tokens + EOS), lp of GNMT (§6.1)
    met: bool = True  # holds every constraint phrase (False: none found within the length limit did)


def encode_lines(
    lines: list[str], tokenizer: Tokenizer, limit: int, where: str, warn: Callable[[str], None] = warn
) -> list[list[int] | None]:
    """Token ids per line (None for a blank line), truncated to ``limit`` tokens with a warning.

    ``where``: how messages name line n, e.g. "test.de line {n}".
    """
    encoded: list[list[int] | None] = [None] * len(lines)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    for i, ids in zip(todo, tokenizer.encode_batch([lines[i] for i in todo])):
        if len(ids) > limit:
            warn(f"{where.format(n=i + 1)}: {len(ids)} tokens, truncated to the model's limit of {limit}")
            ids = ids[:limit]
        encoded[i] = ids or None  # e.g. only control characters: nothing to translate
    return encoded


def summed_log_probs(log_probs: torch.Tensor, tokens: list[list[int]]) -> list[float]:
    """log_probs (B, T, V), row b's tokens (at most T) -> per row, the sum of log P of its tokens."""
    B, T, _ = log_probs.shape
    wanted = torch.zeros(B, T, dtype=torch.long)  # (B, T)
    for row, ids in enumerate(tokens):
        wanted[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    lengths = torch.tensor([len(ids) for ids in tokens])  # (B,)
    scored = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    picked = log_probs.gather(-1, wanted.to(log_probs.device)[..., None]).squeeze(-1)  # (B, T)
    return picked.masked_fill(~scored.to(log_probs.device), 0.0).sum(dim=1).tolist()


def model_languages(config, tokenizer, path: str | Path) -> dict:
    """A model's languages, as ``Translator`` takes them: a multilingual model's target languages and their
    tokens (``corpora.target_languages``), else a bilingual model's target language where known (a released
    model's is not recorded)."""
    languages = target_languages(config.data, tokenizer)
    trained = None if languages or is_released(path) else trained_target(config.data)
    return {"languages": languages, "trained_target": trained}


class Translator:
    """Translate, score, and look at attention, with one model (see the module docstring)."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        settings: EvalConfig,
        device: str | torch.device = "cpu",
        precision: str = "auto",
        warn: Callable[[str], None] = warn,
        languages: dict[str, int] | None = None,
        target_lang: str | None = None,
        trained_target: str | None = None,
        fast: bool = True,
    ):
        """``settings``: beam size, length penalty, batch size (max_tokens) and max_len_offset.
        ``languages``: a multilingual model's target languages, {code: the id of its token} (``<2fr>``, or a
        released Marian model's ``>>fra<<``), put in front of every source; ``target_lang``: the one every
        call uses unless it names another (a multilingual model needs one or the other); ``trained_target``:
        a bilingual model's target language, if known (another ``target_lang`` is then refused).
        ``precision``: "auto" (bf16 on CUDA, fp32 on the CPU), "fp32", "bf16", "fp16" (the precision a run
        validated in is ``results.json``'s ``precision``); or on the CPU "int8" / "int8-bf16": a copy of the
        model with int8 linear layers (``quantize.py``). ``decoding_model`` says how each is run.
        ``fast``: decode with the fast tier's modules (``model``'s own are replaced, in place) and kernels;
        False: the plain core's."""
        self.device = torch.device(device)
        for why in (slow_precision(precision, self.device), faster_precision(precision, self.device)):
            if why is not None:
                warn(f"--precision {precision}: {why}")
        model, self.kernels = kernels_for(model, fast)
        model, self.dtype = quantized_decoding_model(model, precision, self.device)  # dtype: of autocast
        self.model, self.tokenizer, self.settings = model.to(self.device).eval(), tokenizer, settings
        self.warn = warn
        self.languages, self.trained_target = dict(languages or {}), trained_target
        self.target_lang = None
        self.target_lang = self.language_of(target_lang)  # one the model cannot translate into: a ValueError
        self.home_thread = threading.current_thread()  # the thread that built it (_check_thread)
        self.warned_thread = False
        self.max_source_tokens = source_token_limit(model.config, settings)
        self.max_target_tokens = model.config.max_positions - 1  # + the start token
        if self.max_source_tokens < 1:
            raise ValueError(
                f"model.max_positions={model.config.max_positions} leaves no room for a source with "
                f"eval.max_len_offset={settings.max_len_offset}"
            )

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu", precision: str = "auto",
        target_lang: str | None = None, fast: bool = True, **settings,
    ) -> "Translator":  # fmt: skip
        """A checkpoint written by ``train.py``, or a released model: a Hugging Face Marian folder or
        ``hf:NAME`` (see ``released.py``). ``device``: "cpu", "cuda", "auto", ...; ``settings``: overrides of
        the checkpoint's ``eval`` settings (beam_size=4, length_penalty=1.0, max_tokens=...); ``target_lang``:
        the language to translate into, by default (a multilingual model's; a ValueError if it has none)."""
        device = resolve_device(str(device))
        model, tokenizer, config = load_model(path, device)
        try:
            settings = dataclasses.replace(config.eval, **settings)
            languages = model_languages(config, tokenizer, path)
            translator = cls(model, tokenizer, settings, device, precision, fast=fast, **languages)
        except ValueError as error:  # the checkpoint's own settings cannot work
            raise CheckpointError(f"checkpoint {path}: {error}") from None
        translator.target_lang = translator.language_of(target_lang)  # one it cannot: a ValueError
        return translator

    def autocast(self):
        return autocast(self.device, self.dtype)

    # -------------------------------------------------------------------------------- token ids

    def language_of(self, target_lang: str | None) -> str | None:
        """The target language a call translates into: ``target_lang``, else the translator's own; checked
        against what the model translates into (a ValueError naming the choices)."""
        lang = target_lang if target_lang is not None else self.target_lang
        if self.languages and lang is not None and lang not in self.languages:
            raise ValueError(
                f"target language {lang!r}: this model translates into {', '.join(self.languages)}"
            )
        if not self.languages and lang is not None and self.trained_target not in (None, lang):
            raise ValueError(
                f"target language {lang!r}: this model translates into {self.trained_target} only"
            )
        return lang

    def language_ids(self, target_lang: str | None = None) -> list[int]:
        """The ids in front of every source: a multilingual model's token of the target language (a
        ValueError if none is chosen); none for a bilingual model."""
        lang = self.language_of(target_lang)
        if not self.languages:
            return []
        if lang is None:
            raise ValueError(
                f"this model translates into {', '.join(self.languages)}: choose a target language"
            )
        return [self.languages[lang]]

    def encode(
        self, sentences: list[str], where: str = "sentence {n}", target_lang: str | None = None
    ) -> list[list[int] | None]:
        """Source ids per sentence (None: blank), truncated to ``max_source_tokens`` with a warning; a
        multilingual model's start with the token of ``target_lang`` (default: the translator's)."""
        prefix = self.language_ids(target_lang)
        ids = encode_lines(sentences, self.tokenizer, self.max_source_tokens - len(prefix), where, self.warn)
        return [None if one is None else prefix + one for one in ids]

    def encode_targets(self, sentences: list[str], where: str = "target {n}") -> list[list[int]]:
        """Target ids per sentence (blank: []), truncated to ``max_target_tokens`` with a warning."""
        targets = target_tokenizer(self.tokenizer)
        ids = encode_lines(sentences, targets, self.max_target_tokens, where, self.warn)
        return [i or [] for i in ids]

    def encode_constraints(
        self, constraints: list[list[str]], where: str = "sentence {n}"
    ) -> list[list[list[int]]]:
        """Per sentence, the target ids of each of its constraint phrases; a ``ValueError`` naming the
        sentence for a phrase that tokenizes to nothing or phrases that fill the model's positions."""
        encoded = []
        for n, phrases in enumerate(constraints, start=1):
            if isinstance(phrases, str):
                raise TypeError(f"{where.format(n=n)}: constraints are a list of phrases, not one str")
            targets = target_tokenizer(self.tokenizer)
            ids = [one or None for one in targets.encode_batch(list(phrases))]  # whole
            for j, (phrase, one) in enumerate(zip(phrases, ids), start=1):
                if one is None:
                    raise ValueError(f"{where.format(n=n)}: constraint {j} ({phrase!r}) tokenizes to nothing")
            tokens, room = sum(map(len, ids)), self.model.config.max_positions - 1  # EOS takes a place
            if tokens > room:
                raise ValueError(
                    f"{where.format(n=n)}: its constraints hold {tokens} tokens, more than a translation "
                    f"can ({room})"
                )
            encoded.append(ids)
        return encoded

    def decode(self, ids: list[int]) -> str:
        """Ids -> one line of text (a newline inside a translation would shift every later line)."""
        return self.tokenizer.decode(ids).replace("\r", " ").replace("\n", " ")

    def _settings(self, beam: int | None) -> EvalConfig:
        if beam is None:
            return self.settings
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        return dataclasses.replace(self.settings, beam_size=beam)

    def translate_ids(
        self, sources: list[list[int] | None], beam: int | None = None, nbest: int | None = None,
        with_scores: bool = False, prefixes: list[list[int]] | None = None, sampling: Sampling | None = None,
        constraints: list[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:  # fmt: skip
        """Per source, its ``nbest`` (default 1) best translations, best first; a blank source (None) gets
        one empty hypothesis. Scores (``log_prob``) only with ``nbest`` or ``with_scores``, else NaN.

        Greedy decoding for beam 1 (its scores teacher-forced), beam search otherwise (its scores its own);
        the first hypothesis is always the one ``translate`` gives without scores. ``prefixes``: per source,
        target ids its translations start with ([]: none). ``sampling``: draw each token (beam 1 only).
        ``constraints``: per source, target phrases (each a list of ids) its translation must contain
        ([]: none); those sources go through ``constraints.constrained_beam_search`` (beam 1: beam
        ``constraints.GREEDY_BEAM``), the others through the plain searches, as without constraints."""
        settings = self._settings(beam)
        if nbest is not None and not 1 <= nbest <= settings.beam_size:
            raise ValueError(f"nbest must be in [1, beam={settings.beam_size}], got {nbest}")
        if sampling is not None and settings.beam_size > 1:  # with scores or n-best lists too
            raise ValueError(f"sampling draws one token at a time: it needs beam 1, not {settings.beam_size}")
        for name, given in (("prefixes", prefixes), ("constraints", constraints)):
            if given is not None and len(given) != len(sources):
                raise ValueError(f"{len(sources)} sources but {len(given)} {name}")
        todo = [i for i, src in enumerate(sources) if src is not None]
        phrased = [i for i in todo if constraints is not None and constraints[i]]
        if phrased and sampling is not None:
            raise ValueError("constraints are met by the constrained beam search: not with sampling")
        plain = sorted(set(todo) - set(phrased))
        results = [[Hypothesis([], 0.0, True, 0.0)] for _ in sources]
        rows = lambda chosen, given: None if given is None else [given[i] for i in chosen]  # noqa: E731
        found = []
        if plain:  # (a batch all of whose sentences have constraints runs no plain search)
            found = self._hypotheses(
                [sources[i] for i in plain], settings, nbest, with_scores, rows(plain, prefixes), sampling
            )
        if phrased:
            found += self._constrained([sources[i] for i in phrased], settings, nbest, with_scores,
                                       rows(phrased, prefixes), rows(phrased, constraints))  # fmt: skip
        lp = lambda h: length_normaliser(len(h.ids) + h.ended, settings.length_penalty)  # noqa: E731
        for i, hyps in zip(plain + phrased, found):
            results[i] = [h._replace(score=h.log_prob / lp(h)) for h in hyps]
        return results

    def _hypotheses(
        self, src_ids, settings, nbest, with_scores, prefixes, sampling
    ) -> list[list[Hypothesis]]:
        """``translate_ids`` without constraints, for sources that are not blank."""
        no_prefixes = [None] * len(src_ids)
        if settings.beam_size > 1 and (nbest is not None or with_scores):
            searched = self.search_nbest(src_ids, settings, nbest or 1, prefixes)
            return [[Hypothesis(ids, p, self.ended(src, ids, pre)) for ids, p in hyps]
                    for src, hyps, pre in zip(src_ids, searched, prefixes or no_prefixes)]  # fmt: skip
        hyp_ids = self.search(src_ids, settings, prefixes=prefixes, sampling=sampling)
        ended = [self.ended(*row) for row in zip(src_ids, hyp_ids, prefixes or no_prefixes)]
        scores = (
            self.score_ids(src_ids, hyp_ids, ended) if with_scores or nbest else [float("nan")] * len(src_ids)
        )
        return [[Hypothesis(*h)] for h in zip(hyp_ids, scores, ended)]

    def _constrained(
        self, src_ids, settings, nbest, with_scores, prefixes, constraints
    ) -> list[list[Hypothesis]]:
        """``translate_ids`` for sources with constraints: the constrained search's hypotheses, with its
        own log-probs for n-best lists and scores."""
        if settings.beam_size == 1:
            settings = dataclasses.replace(settings, beam_size=GREEDY_BEAM)
        searched = self.search_constrained(src_ids, settings, constraints, prefixes, nbest or 1)
        scored, pres = nbest is not None or with_scores, prefixes or [None] * len(src_ids)
        return [
            [Hypothesis(ids, log_p if scored else float("nan"), self.ended(src, ids, pre, phrases), met=met)
             for ids, log_p, met in hyps]
            for src, hyps, pre, phrases in zip(src_ids, searched, pres, constraints)
        ]  # fmt: skip

    def ended(
        self, src: list[int], hyp: list[int], prefix: list[int] | None = None, phrases: list | None = None
    ) -> bool:
        """Whether a translation of ``src`` (made to start with ``prefix``, to contain ``phrases``) ended
        with EOS, not cut at the length limit."""
        steering = self._steering([prefix], [phrases] if phrases else None, [0], "cpu")
        return ended_with_eos(self.model, src, hyp, self.settings.max_len_offset, steering)

    def _steering(self, prefixes, constraints, rows: list[int], device):
        """The steering of a batch's ``rows``: their prefixes, their constraints, both or None."""
        max_positions = self.model.config.max_positions
        prefix = Prefix.of(prefixes, rows, device, max_positions)
        if constraints is None:
            return prefix
        wanted = Constraints.of([constraints[i] for i in rows], self.model.eos_id, max_positions, device)
        return wanted if prefix is None else Together(prefix, wanted)

    def score_ids(
        self, sources: list[list[int] | None], targets: list[list[int]], with_eos: list[bool] | None = None
    ) -> list[float]:
        """Teacher-forced log P(target [+ EOS] | source) per pair; 0.0 for a blank source (None)."""
        todo = [i for i, src in enumerate(sources) if src is not None]
        eos = [True if with_eos is None else with_eos[i] for i in todo]
        totals = self.sequence_log_probs([sources[i] for i in todo], [targets[i] for i in todo], eos)
        scores = [0.0] * len(sources)
        for i, total in zip(todo, totals):
            scores[i] = total
        return scores

    def attention_ids(
        self, source: list[int], target: list[int] | None = None, ended: bool = True
    ) -> SentenceAttention:
        """Every attention weight for ``source`` and ``target`` (teacher-forced, with EOS unless ``ended`` is
        False) or, for None, the greedy translation (without EOS if it stopped at the length limit)."""
        if target is None:
            target = self.search([source], dataclasses.replace(self.settings, beam_size=1))[0]
            ended = self.ended(source, target)
        with self.autocast():
            return pair_attention(self.model, self.tokenizer, source, target, ended)

    # ------------------------------------------------------------------- the searches, batched by length

    @torch.no_grad()
    def search(
        self, src_ids: list[list[int]], settings: EvalConfig | None = None, progress: str | None = None,
        use_cache: bool = True, prefixes: list[list[int]] | None = None, sampling: Sampling | None = None,
    ) -> list[list[int]]:  # fmt: skip
        """THE decoding driver: every source (ids without EOS) -> its best translation's ids, in input
        order; greedy for beam 1, else beam search. ``progress``: a label for a progress bar;
        ``use_cache=False``: greedy recomputes the whole prefix every step (the slow reference);
        ``prefixes``: per source, the target ids to start with; ``sampling``: draw tokens (beam 1 only)."""
        s = settings or self.settings
        if sampling is not None and s.beam_size > 1:
            raise ValueError(f"sampling draws one token at a time: it needs beam 1, not {s.beam_size}")
        generator = None if sampling is None else sampling.generator(self.device)
        choose = None
        if sampling is not None:  # never UNK unless asked (a Translator without a tokenizer has none)
            unk = getattr(self.tokenizer, "unk_id", None)
            choose = lambda logits: sample_tokens(logits, sampling, generator, unk)  # noqa: E731
        model, offset, kernels = self.model, s.max_len_offset, self.kernels

        def decode(src: torch.Tensor, rows: list[int]) -> list[list[int]]:
            steering = Prefix.of(prefixes, rows, self.device, model.config.max_positions)
            if s.beam_size > 1:
                return beam_search(model, src, s.beam_size, s.length_penalty, offset, None, steering, kernels)
            return greedy_decode(model, src, offset, use_cache, steering, choose)

        return self._in_batches(src_ids, s, decode, progress)

    @torch.no_grad()
    def search_nbest(
        self, src_ids: list[list[int]], settings: EvalConfig, nbest: int,
        prefixes: list[list[int]] | None = None,
    ) -> list[list[tuple[list[int], float]]]:  # fmt: skip
        """Beam search (``settings.beam_size``, even 1): per source its ``nbest`` best hypotheses as (ids,
        log-prob), best first (see ``nbest.beam_search_nbest``)."""
        s, model, kernels = settings, self.model, self.kernels

        def decode(src: torch.Tensor, rows: list[int]) -> list[list[tuple[list[int], float]]]:
            steering = Prefix.of(prefixes, rows, self.device, model.config.max_positions)
            return beam_search_nbest(
                model, src, s.beam_size, s.length_penalty, s.max_len_offset, nbest, steering, kernels
            )

        return self._in_batches(src_ids, s, decode)

    @torch.no_grad()
    def search_constrained(
        self, src_ids: list[list[int]], settings: EvalConfig, constraints: list[list[list[int]]],
        prefixes: list[list[int]] | None = None, nbest: int = 1,
    ) -> list[list[tuple[list[int], float, bool]]]:  # fmt: skip
        """The constrained beam search (``settings.beam_size``): per source, its ``nbest`` best hypotheses
        as (ids, log-prob, whether it holds every phrase of its ``constraints``), best first."""
        s, model = settings, self.model

        def decode(src: torch.Tensor, rows: list[int]) -> list[list[tuple[list[int], float, bool]]]:
            prefix = Prefix.of(prefixes, rows, self.device, model.config.max_positions)
            phrases = [constraints[i] for i in rows]
            return constrained_nbest(
                model, src, s.beam_size, s.length_penalty, s.max_len_offset, phrases, nbest, prefix
            )

        return self._in_batches(src_ids, s, decode)

    def _in_batches(self, src_ids, settings: EvalConfig, decode, progress: str | None = None) -> list:
        """``decode`` (src (B, S), the batch's input rows -> B results) under this translator's autocast, over
        ``runtime.search.decode_in_batches``' length-sorted batches; results in input order."""
        self.model.eval()
        self._check_thread()
        bar = tqdm(total=len(src_ids), desc=progress, unit="sent", leave=False, disable=progress is None)

        def in_precision(src: torch.Tensor, rows: list[int]) -> list:
            with self.autocast():
                return decode(src, rows)

        # beam search without autocast: prepacked weights (fast/prepacked.py says why not greedy)
        pack = self.kernels is FAST and self.dtype is None and settings.beam_size > 1
        outputs = decode_in_batches(self.model, src_ids, settings.max_tokens, in_precision, bar.update, pack)
        bar.close()
        return outputs

    def _check_thread(self) -> None:
        """Warn once when decoding on the CPU in another thread than the one that built this Translator,
        while that one lives. Two threads that have run PyTorch's parallel operations on a CPU keep two
        OpenMP thread pools, and then every small operation waits for a sleeping thread to wake: decoding
        runs markedly slower; built and used in one thread, at full speed (docs/benchmarks.md, "Speed
        choices in the code")."""
        here = threading.current_thread()
        if self.device.type != "cpu" or here is self.home_thread or self.warned_thread:
            return
        if self.home_thread.is_alive():
            self.warned_thread = True
            self.warn(
                f"this Translator was built in thread {self.home_thread.name!r} and decodes in "
                f"{here.name!r}: on a CPU, PyTorch in two threads runs markedly slower; build it in the "
                "thread that uses it"
            )

    @torch.no_grad()
    def sequence_log_probs(
        self, src_ids: list[list[int]], tgt_ids: list[list[int]], with_eos: list[bool]
    ) -> list[float]:
        """Teacher-forced log P(target | source) per pair: the natural-log probabilities of the target's
        tokens and of its EOS (``with_eos[i]`` False: without EOS, for a translation cut at the length
        limit), summed, under the distribution the searches decode from (PAD and the start token ruled out).
        Exactly the tokens given are scored: never more positions than the model has."""
        self.model.eval()
        self._check_thread()
        model = self.model
        # tgt_in = start + every scored token but the last: one position per scored token, never more
        inputs = [t if eos else t[:-1] for t, eos in zip(tgt_ids, with_eos)]
        lengths = ([len(s) for s in src_ids], [len(t) for t in inputs])
        batches = make_batches(*lengths, self.settings.max_tokens, shuffle=False)
        totals, order = [], []
        for batch in iter_batches(list(src_ids), inputs, batches, *model.pad_start_eos):
            batch = batch.to(self.device)
            with self.autocast():
                logits = model(batch.src, batch.tgt_in)  # (B, T, V)
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B, T, V) as beam search
            logits[..., model.never_produced] = float("-inf")  # as decoding rules them out
            log_probs = torch.log_softmax(logits, dim=-1)  # (B, T, V)
            rows = batch.indices.tolist()
            scored = [tgt_ids[i] + [model.eos_id] if with_eos[i] else tgt_ids[i] for i in rows]
            totals += summed_log_probs(log_probs, scored)
            order += rows
        return restore_order(totals, order, len(src_ids))

    def evaluate(
        self, src_ids: list[list[int]], references: list[str], progress: str | None = None
    ) -> tuple[list[list[int]], list[str], dict[str, float | str]]:
        """Translate a split and score it: (hypothesis ids, detokenized hypotheses, ``bleu_chrf``)."""
        hyp_ids = self.search(src_ids, progress=progress)
        hyps = self.tokenizer.decode_batch(hyp_ids)
        return hyp_ids, hyps, bleu_chrf(hyps, references)

    # ------------------------------------------------------------------------------------- text

    def translate(
        self,
        sentences: list[str],
        beam: int | None = None,
        nbest: int | None = None,
        with_scores: bool = False,
        prefix: list[str] | None = None,
        sampling: Sampling | None = None,
        target_lang: str | None = None,
        constraints: list[list[str]] | None = None,
    ) -> list:
        """Translations of ``sentences`` (a list of str), in order: per sentence its text; with
        ``with_scores`` (text, log-prob); with ``nbest`` a list of the ``nbest`` best (texts, or (text,
        log-prob) pairs), best first. ``beam``: beam size (default: the settings'; 1 = greedy).
        ``prefix``: per sentence, target text its translation starts with ("" = none); the rest is
        searched, and scores count the whole translation. ``sampling``: draw tokens instead (beam 1).
        ``target_lang``: the language to translate into (multilingual models; default: the translator's).
        ``constraints``: per sentence, target phrases its translation must contain ([]: none); a sentence
        whose translation could not hold them all within the length limit is named in a warning."""
        if isinstance(sentences, str):
            raise TypeError("translate() takes a list of sentences, not one str")
        prefixes = None if prefix is None else self.encode_targets(list(prefix), "prefix {n}")
        phrases = None if constraints is None else self.encode_constraints(constraints)
        sources = self.encode(list(sentences), target_lang=target_lang)
        results = self.translate_ids(sources, beam, nbest, with_scores, prefixes, sampling, phrases)
        for n, hyps in enumerate(results, start=1):
            if not hyps[0].met:
                self.warn(f"sentence {n}: no translation within the length limit holds every constraint")
        view = [[(self.decode(h.ids), h.log_prob) if with_scores else self.decode(h.ids) for h in hyps]
                for hyps in results]  # fmt: skip
        return view if nbest is not None else [hyps[0] for hyps in view]

    def score(self, sources: list[str], references: list[str], target_lang: str | None = None) -> list[float]:
        """log P(reference + EOS | source) per pair: natural log, summed over tokens (blank source: 0.0)."""
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references")
        encoded = self.encode(list(sources), target_lang=target_lang)
        return self.score_ids(encoded, self.encode_targets(list(references)))

    def attention(
        self, source: str, target: str | None = None, target_lang: str | None = None
    ) -> SentenceAttention:
        """Cross and self attention weights per layer and head, with the token labels of their axes: for
        ``target`` teacher-forced, or (None) for the model's own greedy translation."""
        src = self.encode([source], target_lang=target_lang)[0]
        if src is None:
            raise ValueError("the source is blank: there is no attention to show")
        return self.attention_ids(src, None if target is None else self.encode_targets([target])[0])

    def default_align_layer(self) -> int:
        """The decoder layer whose cross-attention ``alignments`` uses by default: the penultimate one (the
        last with a single layer), see docs/alignments.md."""
        return max(len(self.model.decoder.layers) - 2, 0)

    def alignments(
        self, source: str, target: str | None = None, layer: int | None = None, rows: str = "predicted",
        target_lang: str | None = None,
    ) -> list[tuple[int, int]]:  # fmt: skip
        """Word alignment (source word, target word), 0-based, of ``target`` (None: the greedy translation)
        from the cross-attention of decoder ``layer`` averaged over heads (``alignment.word_alignment``)."""
        if not source.strip():
            return []
        return self.alignments_of(self.attention(source, target, target_lang), layer, rows)

    def alignments_of(
        self, attention: SentenceAttention, layer: int | None = None, rows: str = "predicted"
    ) -> list[tuple[int, int]]:
        """``alignments`` from an attention already computed."""
        n_layers = len(attention.cross)
        layer = self.default_align_layer() if layer is None else layer
        if not -n_layers <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range: the decoder has {n_layers} layers")
        eos = self.tokenizer.id_to_piece([self.tokenizer.eos_id])[0]
        tgt = attention.target_pieces
        tgt = tgt[:-1] if tgt and tgt[-1] == eos else tgt
        weights = attention.cross[layer].mean(dim=0)  # (T, S) heads averaged
        # a multilingual model's language token is no word of the source: words count after it
        skip = int(any(piece in self.language_pieces() for piece in attention.source_pieces[:1]))
        return word_alignment(weights[:, skip:], attention.source_pieces[skip:-1], tgt, rows)

    def language_pieces(self) -> list[str]:
        """The pieces of the target-language tokens (none for a bilingual model)."""
        return self.tokenizer.id_to_piece(list(self.languages.values())) if self.languages else []
