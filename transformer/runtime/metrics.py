"""Metrics: the loss over a set of batches, and BLEU / chrF with sacreBLEU (the training loss is
``loss.token_loss``). Decoding is ``translator.Translator``'s job.

BLEU is computed on detokenized, cased text against the raw references, so the figures are comparable
with published sacreBLEU scores (the signature says exactly how they were computed).
"""

import math
from collections.abc import Iterable

import sacrebleu
import torch

from transformer.core.batches import Batch
from transformer.core.loss import token_loss
from transformer.core.model import Transformer


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


def bleu_chrf(hypotheses: list[str], references: list[str]) -> dict[str, float | str]:
    """Corpus BLEU and chrF with sacreBLEU's defaults (13a tokenization, cased), and BLEU's length ratio
    (the hypotheses' words ÷ the references'; below 1 costs the brevity penalty)."""
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    return {
        "bleu": bleu_score.score,
        "length_ratio": bleu_score.ratio,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "signature": str(bleu.get_signature()),
    }
