"""A released Marian model's own tokenizer (two SentencePiece models and a vocabulary of pieces -> ids), with
the interface of ``tokenizer.Tokenizer`` that batching, decoding, the token store and checkpoints use.

Marian numbers its tokens by ``vocab.json``, not by SentencePiece's ids: in opus-mt models EOS is 0, UNK 1
and PAD the last id, and the decoder starts from PAD. Source sentences are encoded with ``source.spm``,
targets (training targets, references) with ``target.spm`` (``target_side``).

The tokenizer travels as its files: ``files`` holds the bytes of a Marian folder's tokenizer files
(``source.spm``, ``target.spm``, ``vocab.json``, ``tokenizer_config.json``) plus ``start.json`` (the decoder
start id). ``to_bytes`` packs them into one zip with fixed timestamps (the same tokenizer gives the same
bytes: the token store's key, a checkpoint's ``tokenizer`` tensor); ``interop.formats.read_tokenizer``
tells it from a SentencePiece model by the zip signature. ``save`` writes the Marian files into a folder
for ``MarianTokenizer.from_pretrained`` (an export of a fine-tuned model).
"""

import io
import json
import tempfile
import zipfile
from pathlib import Path

from transformer.core.tokenizer import Tokenizer
from transformer.runtime.quiet import quiet_libraries

MARIAN_FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
START_FILE = "start.json"
FILE_KEYS = ("source_spm", "target_spm", "vocab", "target_vocab_file", "name_or_path", "vocab_file")


def marian_tokenizer_class():
    try:
        from transformers import MarianTokenizer
    except ImportError:
        raise ValueError(
            "it holds a Marian model's tokenizer (fine-tuned from a released model), which needs "
            'transformers: pip install -e ".[hf]"'
        ) from None
    return MarianTokenizer


def files_of(hf_tokenizer, start_id: int) -> dict[str, bytes]:
    """A loaded MarianTokenizer -> the bytes of its files (a joint vocabulary: one ``vocab.json``)."""
    if hf_tokenizer.separate_vocabs:
        raise ValueError(
            "separate source and target vocabularies (separate_vocabs: true) are not supported: the model "
            "of this project has one vocabulary"
        )
    kept = {key: value for key, value in hf_tokenizer.init_kwargs.items()  # the model's own settings
            if key not in FILE_KEYS and isinstance(value, (str, int, float, bool))}  # fmt: skip
    settings = kept | {
        "tokenizer_class": "MarianTokenizer", "source_lang": hf_tokenizer.source_lang,
        "target_lang": hf_tokenizer.target_lang, "unk_token": str(hf_tokenizer.unk_token),
        "eos_token": str(hf_tokenizer.eos_token), "pad_token": str(hf_tokenizer.pad_token),
        "model_max_length": hf_tokenizer.model_max_length, "separate_vocabs": False,
    }  # fmt: skip
    return {
        "source.spm": hf_tokenizer.spm_source.serialized_model_proto(),
        "target.spm": hf_tokenizer.spm_target.serialized_model_proto(),
        "vocab.json": json.dumps(hf_tokenizer.encoder, ensure_ascii=False).encode(),
        "tokenizer_config.json": json.dumps(settings, indent=2, ensure_ascii=False).encode(),
        START_FILE: json.dumps({"decoder_start_token_id": start_id}).encode(),
    }


class MarianText:
    """A MarianTokenizer with the interface of ``tokenizer.Tokenizer``. ``bos_id`` is the decoder start token
    (Marian: the pad id), which decoding never produces."""

    def __init__(self, hf_tokenizer, start_id: int, target: bool = False, files: dict | None = None):
        self.hf, self.target, self._files = hf_tokenizer, target, files
        self.pad_id, self.eos_id, self.unk_id = (
            hf_tokenizer.pad_token_id,
            hf_tokenizer.eos_token_id,
            hf_tokenizer.unk_token_id,
        )
        self.bos_id, self.vocab_size = start_id, len(hf_tokenizer)

    @classmethod
    def from_bytes(cls, data: bytes) -> "MarianText":
        """Rebuild from ``to_bytes()``."""
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            files = {name: archive.read(name) for name in archive.namelist()}
        missing = [name for name in (*MARIAN_FILES, START_FILE) if name not in files]
        if missing:
            raise ValueError(f"a Marian tokenizer bundle without {', '.join(missing)}")
        with tempfile.TemporaryDirectory() as folder:
            for name in MARIAN_FILES:
                (Path(folder) / name).write_bytes(files[name])
            with quiet_libraries():  # no advice to install sacremoses
                hf_tokenizer = marian_tokenizer_class().from_pretrained(folder)
        start_id = json.loads(files[START_FILE])["decoder_start_token_id"]
        return cls(hf_tokenizer, start_id, files=files)

    @property
    def files(self) -> dict[str, bytes]:
        """The tokenizer files' bytes (made when first needed: a tokenizer only translating needs none)."""
        if self._files is None:
            self._files = files_of(self.hf, self.bos_id)
        return self._files

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(self.files):
                entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # the same bytes every time
                entry.compress_type, entry.create_system = zipfile.ZIP_DEFLATED, 3
                archive.writestr(entry, self.files[name])
        return buffer.getvalue()

    @property
    def encoder_version(self) -> str:
        """What turns text into Marian ids besides the files (MarianTokenizer's Python code): part of the
        token store's key, so that another version of it never reuses a store."""
        import transformers

        return f"transformers {transformers.__version__}"

    def save(self, folder: str | Path) -> None:
        """The Marian tokenizer files, for ``MarianTokenizer.from_pretrained(folder)``."""
        for name in MARIAN_FILES:
            (Path(folder) / name).write_bytes(self.files[name])

    @property
    def target_side(self) -> "MarianText":
        return MarianText(self.hf, self.bos_id, target=True, files=self._files)

    def encode_batch(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        """Ids without EOS (``threads`` is SentencePiece's in ``Tokenizer``; MarianTokenizer has one)."""
        if not texts:
            return []
        side = {"text_target": texts} if self.target else {"text": texts}
        return self.hf(**side, add_special_tokens=False)["input_ids"]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def decode_batch(self, batch_ids: list[list[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch_ids]

    def id_to_piece(self, ids: list[int]) -> list[str]:
        return self.hf.convert_ids_to_tokens(list(ids))

    def symbol_id(self, piece: str) -> int | None:
        """The id of a piece of the vocabulary (a language token such as ``>>fra<<``), else None."""
        return self.hf.encoder.get(piece)

    def language_pieces(self) -> list[str]:
        """The target-language tokens of a multilingual Marian model (``>>fra<<``, ...)."""
        return list(self.hf.supported_language_codes)


def read_either(data: bytes):
    """A checkpoint's tokenizer bytes -> a ``MarianText`` (a zip of Marian files) or our ``Tokenizer``: the
    reader of ``interop/formats.py``, for interop's own use (it imports no module above runtime)."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        return MarianText.from_bytes(data)
    return Tokenizer.from_bytes(data)
