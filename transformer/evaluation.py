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

from transformer.data import Batch, iter_batches, make_batches, restore_order
from transformer.decoding import beam_search, greedy_decode
from transformer.model import Transformer
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
    max_tokens: int = 8000,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    max_len_offset: int = 50,
    progress: str | None = None,
) -> list[list[int]]:
    """Decode every source sentence (ids without EOS); batched by length, returned in input order.

    ``progress``: a label for a progress bar over the sentences (None: no bar).
    """
    model.eval()
    tgt_lengths = [len(s) for s in src_ids]  # a guess of the output length, for batching only
    batches = make_batches([len(s) for s in src_ids], tgt_lengths, max_tokens, shuffle=False)
    empty = [[] for _ in src_ids]
    outputs, order = [], []
    pad, bos, eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    bar = tqdm(total=len(src_ids), desc=progress, unit="sent", leave=False, disable=progress is None)
    for batch in iter_batches(list(src_ids), empty, batches, pad, bos, eos):
        bar.update(len(batch.indices))
        src = batch.src.to(device)
        with autocast():
            if beam_size > 1:
                hyps = beam_search(model, src, bos, eos, beam_size, length_penalty, max_len_offset)
            else:
                hyps = greedy_decode(model, src, bos, eos, max_len_offset)
        outputs += hyps
        order += batch.indices.tolist()
    bar.close()
    return restore_order(outputs, order, len(src_ids))


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
