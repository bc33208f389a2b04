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
from transformer.decoding import beam_search, greedy_decode, max_lengths
from transformer.model import Attention, Transformer
from transformer.tokenizer import Tokenizer


def token_loss(logits: torch.Tensor, tgt_out: torch.Tensor, pad_id: int, label_smoothing: float):
    """Summed cross-entropy over the non-pad target tokens. logits (B, T, V), tgt_out (B, T)."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(),  # (B·T, V)
        tgt_out.flatten(),  # (B·T,)
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


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
    model.eval()
    tgt_lengths = [len(s) for s in src_ids]  # a guess of the output length, for batching only
    batches = make_batches([len(s) for s in src_ids], tgt_lengths, settings.max_tokens, shuffle=False)
    empty = [[] for _ in src_ids]
    outputs, order = [], []
    pad, bos, eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    bar = tqdm(total=len(src_ids), desc=progress, unit="sent", leave=False, disable=progress is None)
    for batch in iter_batches(list(src_ids), empty, batches, pad, bos, eos):
        bar.update(len(batch.indices))
        src = batch.src.to(device)
        with autocast():
            if settings.beam_size > 1:
                hyps = beam_search(
                    model, src, bos, eos, settings.beam_size, settings.length_penalty, settings.max_len_offset
                )
            else:
                hyps = greedy_decode(model, src, bos, eos, settings.max_len_offset, use_cache)
        outputs += hyps
        order += batch.indices.tolist()
    bar.close()
    return restore_order(outputs, order, len(src_ids))


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
    model: Transformer, tokenizer: Tokenizer, src_ids: list[int], hyp_ids: list[int], max_len_offset: int
) -> tuple[Attention, list[str], list[str], list[str]]:
    """Every layer's attention for one translated sentence, and the sub-word labels of its axes.

    One forward pass over (source + EOS, BOS + translation): the same weights the decoder computed step
    by step. Returns (attention with batch size 1, source labels, labels of what each decoder row
    predicted, labels of what each decoder row read).
    """
    device = next(model.parameters()).device
    src = torch.tensor([src_ids + [tokenizer.eos_id]], device=device)  # (1, S)
    # a translation that stopped at the length limit has no EOS: its last row predicted its last token
    ended = len(hyp_ids) < int(max_lengths(model, src, max_len_offset)[0])
    predicted = hyp_ids + [tokenizer.eos_id] if ended else hyp_ids
    tgt_in = [tokenizer.bos_id] + predicted[:-1]
    _, attention = model(src, torch.tensor([tgt_in], device=device), return_attention=True)
    return (
        attention,
        tokenizer.id_to_piece(src[0].tolist()),
        tokenizer.id_to_piece(predicted),
        tokenizer.id_to_piece(tgt_in),
    )
