"""The encoder-decoder Transformer (§3, Figure 1): ``encode`` the source once, ``decode`` the target.

The data flow (shapes as in the legend of ``core/__init__.py``):

    src (B, S) ──Encoder──▶ memory (B, S, D)
    tgt_in (B, T) = BOS + target ──Decoder(memory)──▶ logits (B, T, V), scored against tgt_out = target + EOS

The token ``tgt_in`` starts with is ``model.start_id`` (BOS); the decoder's self-attention always attends
to it. The special ids (``pad_id``, ``bos_id``, ``eos_id``) are the model's, set when it is built or
imported.
"""

from dataclasses import dataclass

import torch
from torch import nn

from transformer.core.config import ModelConfig
from transformer.core.embeddings import PositionalEncoding, TokenEmbedding
from transformer.core.layers import DecoderLayer, EncoderLayer
from transformer.core.masks import decoder_self_mask, padding_mask

# One decoding cache per decoder layer: {"self": {"k", "v"}, "cross": {"k", "v"}}, each part laid out by
# its attention module (``MultiHeadAttention``).
Cache = list[dict[str, dict[str, torch.Tensor]]]


@dataclass
class Attention:
    """Every layer's attention weights, for visualisation: lists over layers of (B, H, Tq, Tk)."""

    encoder_self: list[torch.Tensor]
    decoder_self: list[torch.Tensor]
    cross: list[torch.Tensor]


def _build_stack(
    stack: nn.Module, config: ModelConfig, embedding: TokenEmbedding, layer: type, n_layers: int
):
    """What the encoder and decoder stacks share: the (tied) embedding, the sinusoids, dropout on their sum,
    N layers, and a final LayerNorm in pre-norm (the last layer's output is not normalised otherwise)."""
    d_model, dropout, norm_first = config.d_model, config.dropout, config.norm_first
    stack.embedding = embedding
    stack.positions = PositionalEncoding(d_model, config.max_positions)
    stack.dropout = nn.Dropout(dropout)
    stack.layers = nn.ModuleList(
        layer(d_model, config.n_heads, config.d_ff, dropout, norm_first) for _ in range(n_layers)
    )
    stack.final_norm = nn.LayerNorm(d_model) if norm_first else None


class Encoder(nn.Module):
    """N encoder layers over embedded + position-encoded source tokens."""

    def __init__(self, config: ModelConfig, embedding: TokenEmbedding):
        super().__init__()
        _build_stack(self, config, embedding, EncoderLayer, config.n_encoder_layers)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor):
        """src (B, S), src_mask (B, 1, 1, S) -> memory (B, S, D), [self-attention (B, H, S, S)] per layer."""
        x = self.dropout(self.positions(self.embedding(src)))  # (B, S, D)
        weights = []
        for layer in self.layers:
            x, w = layer(x, src_mask)
            weights.append(w)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, weights


class Decoder(nn.Module):
    """N decoder layers over the shifted-right target, attending to the encoder's memory."""

    def __init__(self, config: ModelConfig, embedding: TokenEmbedding):
        super().__init__()
        _build_stack(self, config, embedding, DecoderLayer, config.n_decoder_layers)

    def forward(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None,
        src_mask: torch.Tensor | None,
        cache: Cache | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """tgt_in (B, T), memory (B, S, D) -> (B, T, D), self weights [(B, H, T, T)], cross [(B, H, T, S)].

        With a ``cache``, ``tgt_in`` holds only the NEW tokens; positions continue after the cache.
        """
        start = cache[0]["self"]["k"].size(2) if cache and "k" in cache[0]["self"] else 0
        x = self.dropout(self.positions(self.embedding(tgt_in), start))  # (B, T, D)
        self_weights, cross_weights = [], []
        for i, layer in enumerate(self.layers):
            x, w_self, w_cross = layer(x, memory, tgt_mask, src_mask, cache[i] if cache is not None else None)
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, self_weights, cross_weights


def _check_special_ids(model: "Transformer", src_vocab_size: int, tgt_vocab_size: int) -> None:
    """Refuse, by name, special ids that cannot work together (e.g. a tokenizer without BOS, id -1)."""
    for name, vocab in (("pad_id", src_vocab_size), ("pad_id", tgt_vocab_size), ("bos_id", tgt_vocab_size),
                        ("eos_id", tgt_vocab_size)):  # fmt: skip
        if not 0 <= getattr(model, name) < vocab:
            raise ValueError(f"{name}={getattr(model, name)} is not in a vocabulary of {vocab} tokens")
    if model.start_id == model.eos_id:
        raise ValueError(
            f"the decoder starts from id {model.start_id}, which is also eos_id: a translation would end "
            "before it starts"
        )


class Transformer(nn.Module):
    """Encoder, decoder and output projection; the three embeddings tied when the vocabulary is joint."""

    def __init__(
        self, config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int, bos_id: int,
        eos_id: int, start_id: int | None = None,
    ):  # fmt: skip
        """The special ids belong to the model: batching, losses and searches read them here. ``start_id``:
        the token every ``tgt_in`` starts with, BOS unless another is given."""
        super().__init__()
        if config.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"model.share_embeddings needs a joint vocabulary, got src_vocab_size={src_vocab_size} "
                f"and tgt_vocab_size={tgt_vocab_size}"
            )
        self.config, self.pad_id, self.bos_id, self.eos_id = config, pad_id, bos_id, eos_id
        self.start_id = bos_id if start_id is None else start_id
        _check_special_ids(self, src_vocab_size, tgt_vocab_size)
        tgt_embedding = TokenEmbedding(tgt_vocab_size, config.d_model)
        src_embedding = (
            tgt_embedding if config.share_embeddings else TokenEmbedding(src_vocab_size, config.d_model)
        )
        self.encoder = Encoder(config, src_embedding)
        self.decoder = Decoder(config, tgt_embedding)
        self.output_proj = nn.Linear(config.d_model, tgt_vocab_size, bias=False)
        if config.share_embeddings:  # §3.4: the pre-softmax projection is the embedding matrix
            self.output_proj.weight = tgt_embedding.weight
        else:
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=config.d_model**-0.5)

    @property
    def pad_start_eos(self) -> tuple[int, int, int]:
        """(pad, start, eos): what batching pads with, starts ``tgt_in`` with and ends ``tgt_out`` with."""
        return self.pad_id, self.start_id, self.eos_id

    @property
    def never_produced(self) -> list[int]:
        """The tokens the decoder never outputs: PAD and the start token, never EOS (even if it shares their
        id). Decoding rules them out; label smoothing puts no probability on them."""
        return sorted({self.pad_id, self.start_id} - {self.eos_id})

    def encode(self, src: torch.Tensor):
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S) bool, encoder self weights per layer."""
        src_mask = padding_mask(src, self.pad_id)  # (B, 1, 1, S) True = attend
        memory, weights = self.encoder(src, src_mask)
        return memory, src_mask, weights

    def decode(self, tgt_in, memory, src_mask, cache: Cache | None = None, project: bool = True):
        """tgt_in (B, T) -> logits (B, T, V) (``project=False``: features (B, T, D)), decoder self weights,
        cross weights (lists over layers).

        Without a cache: the full shifted-right target under the causal + padding mask. With a cache:
        only the new token(s); no mask is needed since they may see every cached (past) token.
        """
        if cache is not None and tgt_in.size(1) != 1:
            raise ValueError(f"decoding with a cache takes one new token per step, got {tgt_in.size(1)}")
        tgt_mask = None if cache is not None else decoder_self_mask(tgt_in, self.pad_id)  # (B, 1, T, T)
        x, self_weights, cross_weights = self.decoder(tgt_in, memory, tgt_mask, src_mask, cache)
        return (self.output_proj(x) if project else x), self_weights, cross_weights  # (B, T, V | D)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, return_attention: bool = False, project=True):
        """src (B, S), tgt_in (B, T) -> logits (B, T, V) [, Attention].

        ``project=False``: the decoder's output features (B, T, D) instead of logits, for training, whose
        loss applies ``output_proj`` itself a block of rows at a time (``loss.output_loss``)."""
        memory, src_mask, encoder_weights = self.encode(src)
        out, self_weights, cross_weights = self.decode(tgt_in, memory, src_mask, project=project)
        if return_attention:
            return out, Attention(encoder_weights, self_weights, cross_weights)
        return out

    def new_cache(self) -> Cache:
        """An empty incremental-decoding cache, one entry per decoder layer."""
        return [{"self": {}, "cross": {}} for _ in self.decoder.layers]

    def select_cache_rows(
        self, cache: Cache, rows: torch.Tensor, memory_rows: torch.Tensor | None = None
    ) -> None:
        """Keep (and reorder), in place, the batch rows ``rows`` (B',) of the past tokens' keys / values and
        ``memory_rows`` of the memory's: a search that reorders its hypotheses or drops finished sentences.
        ``memory_rows`` None keeps the memory's as they are, right when each row stays with its sentence
        (beam search reordering a sentence's beams) or the sentences share one memory row."""
        for layer, layer_cache in zip(self.decoder.layers, cache):
            layer.self_attn.select_cache_rows(layer_cache["self"], rows)
            if memory_rows is not None:
                layer.cross_attn.select_cache_rows(layer_cache["cross"], memory_rows)


def build_model(config: ModelConfig, tokenizer) -> Transformer:
    """THE way to make a model for a tokenizer (anything with ``vocab_size``, ``pad_id``, ``bos_id``,
    ``eos_id``): a joint vocabulary, and the tokenizer's special ids, which then belong to the model."""
    V = tokenizer.vocab_size
    return Transformer(config, V, V, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
