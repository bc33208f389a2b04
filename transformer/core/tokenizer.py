"""SentencePiece subword tokenizer with fixed special ids (§5.1: a shared BPE vocabulary).

The paper encodes WMT English-German with byte-pair encoding and a *shared* source-target
vocabulary of about 37000 tokens: a run learns one from both sides' sentences.

The special ids are the same for every tokenizer this project trains, so the model, the batching
code and the checkpoints may rely on them:

    PAD_ID = 0   padding; never a prediction target
    UNK_ID = 1   a character the model never saw (decodes to " ⁇ ")
    BOS_ID = 2   starts every `tgt_in` row
    EOS_ID = 3   ends every `src` and `tgt_out` row

Text is normalised with SentencePiece's default `nmt_nfkc` rule (Unicode NFKC, runs of whitespace
collapsed, leading and trailing whitespace removed), so `decode(encode(text)) == text` holds for any
text that is already in that form.
"""

from pathlib import Path

import sentencepiece as spm

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Tokenizer:
    """A trained SentencePiece model: text <-> ids. Adds no BOS/EOS; the batching code does that."""

    def __init__(self, model_path: str | Path) -> None:
        self._init(spm.SentencePieceProcessor(model_file=str(model_path)))

    @classmethod
    def from_bytes(cls, model_proto: bytes) -> "Tokenizer":
        """Rebuild from `to_bytes()` output, e.g. stored in a checkpoint dict."""
        tokenizer = cls.__new__(cls)
        tokenizer._init(spm.SentencePieceProcessor(model_proto=model_proto))
        return tokenizer

    def _init(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor
        found = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(
                f"special ids (pad, unk, bos, eos) are {found}, expected "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}: train the model with train_tokenizer()"
            )
        self._special_ids = {PAD_ID, BOS_ID, EOS_ID}

    def to_bytes(self) -> bytes:
        """The serialized model proto: everything needed to rebuild this tokenizer."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: list[str], threads: int = 2) -> list[list[int]]:
        """Encode many texts in one call (SentencePiece runs them through C++ in one go, on ``threads``
        threads; -1: every core)."""
        return self._sp.encode(list(texts), num_threads=threads)

    def decode(self, ids: list[int]) -> str:
        """Ids -> plain text. PAD/BOS/EOS are dropped wherever they are; trim at EOS beforehand."""
        return self._sp.decode([i for i in ids if i not in self._special_ids])

    def decode_batch(self, batch_ids: list[list[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch_ids]

    def id_to_piece(self, ids: list[int]) -> list[str]:
        """Subword strings ("▁Ein", "<pad>", ...) for labelling plots."""
        return [self._sp.id_to_piece(i) for i in ids]

    def symbol_id(self, piece: str) -> int | None:
        """The id of a user-defined piece (a tag such as ``<2en>``: always one token, never learnt from
        text), else None."""
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto.FromString(self.to_bytes())
        user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
        found = [i for i, p in enumerate(proto.pieces) if p.piece == piece and p.type == user_defined]
        return found[0] if found else None
