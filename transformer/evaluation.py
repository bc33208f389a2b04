"""Evaluation: loss over a set of batches; translation of a whole split; BLEU / chrF with sacreBLEU.

BLEU is computed on detokenized, cased text against the raw references, so the figures are comparable
with published sacreBLEU scores (the signature says exactly how they were computed).
"""

import math
from collections.abc import Iterable, Sequence

import sacrebleu
import torch
import torch.nn.functional as F
from tqdm import tqdm

from transformer.config import EvalConfig
from transformer.data import Batch, iter_batches, make_batches, restore_order
from transformer.decoding import beam_search, beam_search_nbest, greedy_decode, max_lengths
from transformer.model import Attention, Transformer
from transformer.tokenizer import Tokenizer


def token_loss(
    logits: torch.Tensor,
    tgt_out: torch.Tensor,
    pad_id: int,
    label_smoothing: float,
    never_targets: Sequence[int] = (),
) -> torch.Tensor:
    """Summed cross-entropy over the non-pad target tokens. logits (B, T, V), tgt_out (B, T).

    Label smoothing (§5.4): the target distribution puts 1 - ε on the reference token and spreads ε evenly
    over the tokens the decoder can produce, i.e. every token but ``never_targets``
    (``decoding.never_produced``: PAD and the start token). With no ``never_targets`` this is
    ``F.cross_entropy(label_smoothing=ε)``.
    """
    logits, target = logits.flatten(0, 1).float(), tgt_out.flatten()  # (B·T, V), (B·T,)
    if label_smoothing == 0.0:
        return F.cross_entropy(logits, target, ignore_index=pad_id, reduction="sum")
    log_probs = torch.log_softmax(logits, dim=-1)  # (B·T, V)
    real = target != pad_id  # (B·T,)
    nll = -log_probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)  # (B·T,)
    excluded = list(never_targets)
    n_allowed = log_probs.size(-1) - len(excluded)
    smooth = -(log_probs.sum(dim=-1) - log_probs[:, excluded].sum(dim=-1)) / n_allowed  # (B·T,) mean -log p
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth  # (B·T,)
    return per_token.masked_fill(~real, 0.0).sum()


@torch.no_grad()
def evaluate_loss(model: Transformer, batches: Iterable[Batch], device, autocast) -> dict[str, float]:
    """Mean per-token cross-entropy (no label smoothing) and perplexity."""
    model.eval()
    total, n_tokens = 0.0, 0
    for batch in batches:
        batch = batch.to(device)
        with autocast():
            logits = model(batch.src, batch.tgt_in)
        total += token_loss(logits, batch.tgt_out, model.pad_id, 0.0).item()
        n_tokens += batch.n_tgt_tokens
    loss = total / max(n_tokens, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}


@torch.no_grad()
def translate_ids(
    model: Transformer,
    src_ids: Sequence[list[int]],
    tokenizer: Tokenizer,
    device,
    autocast,
    settings: EvalConfig,
    progress: str | None = None,
    use_cache: bool = True,
) -> list[list[int]]:
    """Decode every source sentence (ids without EOS); batched by length, returned in input order.

    ``settings``: the batch size (``max_tokens``), ``beam_size``, ``length_penalty`` and
    ``max_len_offset`` of an ``EvalConfig``. ``progress``: a label for a progress bar over the sentences
    (None: no bar). ``use_cache=False``: greedy decoding recomputes the whole prefix every step (the slow
    reference, for benchmarks).
    """
    bos, eos = tokenizer.bos_id, tokenizer.eos_id

    def decode(src: torch.Tensor) -> list[list[int]]:
        if settings.beam_size > 1:
            return beam_search(
                model, src, bos, eos, settings.beam_size, settings.length_penalty, settings.max_len_offset
            )
        return greedy_decode(model, src, bos, eos, settings.max_len_offset, use_cache)

    return _decode_in_batches(model, src_ids, tokenizer, device, autocast, settings, decode, progress)


@torch.no_grad()
def translate_nbest(
    model: Transformer,
    src_ids: Sequence[list[int]],
    tokenizer: Tokenizer,
    device,
    autocast,
    settings: EvalConfig,
    nbest: int,
) -> list[list[tuple[list[int], float]]]:
    """Like ``translate_ids`` with beam search (``settings.beam_size``, even 1): per sentence, its ``nbest``
    best hypotheses as (ids, log-prob), best first (see ``decoding.beam_search_nbest``)."""
    bos, eos = tokenizer.bos_id, tokenizer.eos_id

    def decode(src: torch.Tensor) -> list[list[tuple[list[int], float]]]:
        return beam_search_nbest(
            model, src, bos, eos, settings.beam_size, settings.length_penalty, settings.max_len_offset, nbest
        )

    return _decode_in_batches(model, src_ids, tokenizer, device, autocast, settings, decode)


def _decode_in_batches(model, src_ids, tokenizer, device, autocast, settings, decode, progress=None) -> list:
    """``decode`` (src (B, S) -> B results) over length-sorted batches of ``settings.max_tokens``; results in
    input order."""
    model.eval()
    tgt_lengths = [len(s) for s in src_ids]  # a guess of the output length, for batching only
    batches = make_batches([len(s) for s in src_ids], tgt_lengths, settings.max_tokens, shuffle=False)
    empty = [[] for _ in src_ids]
    outputs, order = [], []
    bar = tqdm(total=len(src_ids), desc=progress, unit="sent", leave=False, disable=progress is None)
    for batch in iter_batches(list(src_ids), empty, batches, *tokenizer.pad_bos_eos):
        bar.update(len(batch.indices))
        with autocast():
            outputs += decode(batch.src.to(device))
        order += batch.indices.tolist()
    bar.close()
    return restore_order(outputs, order, len(src_ids))


@torch.no_grad()
def sequence_log_probs(
    model: Transformer,
    src_ids: Sequence[list[int]],
    tgt_ids: Sequence[list[int]],
    tokenizer: Tokenizer,
    device,
    autocast,
    settings: EvalConfig,
    with_eos: Sequence[bool] | None = None,
) -> list[float]:
    """Teacher-forced log P(target | source) per pair: the natural-log probabilities of the target's tokens
    and of its EOS (``with_eos[i]`` False: without EOS, for a translation stopped at the length limit),
    summed, under the distribution the searches decode from (PAD and the start token ruled out). Batched by
    ``settings.max_tokens``; in input order. The decoder reads ``model.start_id``."""
    model.eval()
    with_eos = [True] * len(tgt_ids) if with_eos is None else list(with_eos)
    batches = make_batches([len(s) for s in src_ids], [len(t) for t in tgt_ids], settings.max_tokens, False)
    pad, bos, eos = tokenizer.pad_bos_eos
    totals, order = [], []
    for batch in iter_batches(list(src_ids), list(tgt_ids), batches, pad, model.start_id(bos), eos):
        batch = batch.to(device)
        with autocast():
            logits = model(batch.src, batch.tgt_in)  # (B, T, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B, T, V) as beam search
        logits[..., sorted({pad, model.start_id(bos)} - {eos})] = float("-inf")  # as decoding rules them out
        log_probs = torch.log_softmax(logits, dim=-1)  # (B, T, V)
        token_log_probs = log_probs.gather(-1, batch.tgt_out[..., None]).squeeze(-1)  # (B, T)
        indices = batch.indices.tolist()
        lengths = torch.tensor([len(tgt_ids[i]) + with_eos[i] for i in indices], device=device)  # (B,)
        scored = torch.arange(token_log_probs.size(1), device=device)[None, :] < lengths[:, None]  # (B, T)
        totals += token_log_probs.masked_fill(~scored, 0.0).sum(dim=1).tolist()
        order += indices
    return restore_order(totals, order, len(src_ids))


def evaluate_split(
    model: Transformer, split: tuple[list, list], refs: list[str], tokenizer: Tokenizer, device, autocast,
    settings: EvalConfig, progress: str | None = None,
) -> tuple[dict[str, float | str], list[list[int]], list[str]]:  # fmt: skip
    """Loss and perplexity (teacher-forced) and BLEU / chrF of the translations of one split (source and
    target ids). Returns (scores, hypothesis ids, detokenized hypotheses)."""
    src_ids, tgt_ids = split
    batches = make_batches([len(s) for s in src_ids], [len(t) for t in tgt_ids], settings.max_tokens, False)
    loss = evaluate_loss(
        model, iter_batches(src_ids, tgt_ids, batches, *tokenizer.pad_bos_eos), device, autocast
    )
    hyp_ids, hyps, scores = translate_and_score(
        model, src_ids, refs, tokenizer, device, autocast, settings, progress
    )
    return loss | scores, hyp_ids, hyps


def translate_and_score(
    model: Transformer,
    src_ids: Sequence[list[int]],
    references: list[str],
    tokenizer: Tokenizer,
    device,
    autocast,
    settings: EvalConfig,
    progress: str | None = None,
) -> tuple[list[list[int]], list[str], dict[str, float | str]]:
    """Translate a split and score it: (hypothesis ids, detokenized hypotheses, ``bleu_chrf``)."""
    hyp_ids = translate_ids(model, src_ids, tokenizer, device, autocast, settings, progress)
    hyps = tokenizer.decode_batch(hyp_ids)
    return hyp_ids, hyps, bleu_chrf(hyps, references)


def bleu_chrf(hypotheses: list[str], references: list[str]) -> dict[str, float | str]:
    """Corpus BLEU and chrF with sacreBLEU's defaults (13a tokenization, cased)."""
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "signature": str(bleu.get_signature()),
    }


@torch.no_grad()
def sentence_attention(
    model: Transformer,
    tokenizer: Tokenizer,
    src_ids: list[int],
    hyp_ids: list[int],
    max_len_offset: int,
    ended: bool | None = None,
) -> tuple[Attention, list[str], list[str], list[str]]:
    """Every layer's attention for one translated sentence, and the sub-word labels of its axes.

    One forward pass over (source + EOS, BOS + translation): the same weights the decoder computed step
    by step. Returns (attention with batch size 1, source labels, labels of what each decoder row
    predicted, labels of what each decoder row read). ``ended``: whether the last row predicts EOS (None:
    unless the translation stopped at the length limit; True for a given reference, teacher-forced).
    """
    device = next(model.parameters()).device
    src = torch.tensor([src_ids + [tokenizer.eos_id]], device=device)  # (1, S)
    # a translation that stopped at the length limit has no EOS: its last row predicted its last token
    if ended is None:
        ended = len(hyp_ids) < int(max_lengths(model, src, max_len_offset)[0])
    predicted = hyp_ids + [tokenizer.eos_id] if ended else hyp_ids
    tgt_in = [model.start_id(tokenizer.bos_id)] + predicted[:-1]
    _, attention = model(src, torch.tensor([tgt_in], device=device), return_attention=True)
    return (
        attention,
        tokenizer.id_to_piece(src[0].tolist()),
        tokenizer.id_to_piece(predicted),
        tokenizer.id_to_piece(tgt_in),
    )
