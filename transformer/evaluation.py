"""Losses and metrics: the training loss (label smoothing, §5.4), the loss over a set of batches, and BLEU /
chrF with sacreBLEU. Decoding is ``translator.Translator``'s job.

BLEU is computed on detokenized, cased text against the raw references, so the figures are comparable
with published sacreBLEU scores (the signature says exactly how they were computed).
"""

import math
from collections.abc import Iterable, Sequence

import sacrebleu
import torch
import torch.nn.functional as F

from transformer.data import Batch
from transformer.model import Transformer


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
    (``model.never_produced``: PAD and the start token). With no ``never_targets`` this is
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
