"""Every attention weight of one (source, target) pair, with the sub-word labels of its axes: what the
validation heatmaps draw, and what ``Translator.attention`` gives.
"""

from dataclasses import dataclass

import torch

from transformer.core.model import Attention, Transformer


@dataclass
class SentenceAttention:
    """Every attention weight of one (source, target) pair, on the CPU in float32, batch dimension dropped."""

    source_pieces: list[str]  # S labels: the source's sub-words + "</s>"
    target_pieces: list[str]  # T labels: what each decoder row predicted (target sub-words [+ "</s>"])
    input_pieces: list[str]  # T labels: what each decoder row read (start token + target sub-words)
    cross: list[torch.Tensor]  # per decoder layer (H, T, S)
    encoder_self: list[torch.Tensor]  # per encoder layer (H, S, S)
    decoder_self: list[torch.Tensor]  # per decoder layer (H, T, T)

    @property
    def labels(self) -> tuple[list[str], list[str], list[str]]:
        """(source, predicted, input) pieces: the ``labels`` of ``plotting.add_attention_figures``."""
        return self.source_pieces, self.target_pieces, self.input_pieces

    def batched(self) -> Attention:
        """As a ``model.Attention`` of batch size 1 (what ``plotting.add_attention_figures`` draws)."""
        return Attention(
            *([w[None] for w in ws] for ws in (self.encoder_self, self.decoder_self, self.cross))
        )


@torch.no_grad()
def pair_attention(
    model: Transformer, tokenizer, source: list[int], target: list[int], ended: bool = True
) -> SentenceAttention:
    """Every attention weight of the model reading ``source`` and, teacher-forced, ``target`` (ids without
    EOS) followed by EOS unless ``ended`` is False (a translation cut at the length limit: its last decoder
    row predicted a token, not EOS). Run it under the autocast the model decodes in."""
    device = next(model.parameters()).device
    eos = model.eos_id
    src = torch.tensor([source + [eos]], device=device)  # (1, S)
    predicted = target + [eos] if ended else target  # (T,) what each decoder row predicts
    tgt_in = [model.start_id] + predicted[:-1]  # (T,) what each decoder row reads
    _, attention = model(src, torch.tensor([tgt_in], device=device), return_attention=True)
    weights = [[w[0].float().cpu() for w in ws] for ws in (attention.cross, attention.encoder_self,
                                                            attention.decoder_self)]  # fmt: skip
    pieces = tokenizer.id_to_piece
    return SentenceAttention(pieces(src[0].tolist()), pieces(predicted), pieces(tgt_in), *weights)
