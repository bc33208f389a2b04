"""Several corpora in one run (``data.corpora``): which they are, their languages, and the tokens put in
front of their sources (what training, translating and serving all read from a model's config).

    data:
      corpora:
        - {dataset: multi30k, src_lang: de, tgt_lang: en}
        - {dataset: text, train_prefix: bt/mono, src_lang: de, tgt_lang: en, tag: bt, weight: 0.5,
           name: bt-de-en, valid_size: 500, test_size: 500}
      sampling_temperature: 1.0

A corpus takes the keys of the one corpus of a run without ``corpora`` (``CORPUS_KEYS``: where it is, its
languages, how it is carved and cleaned; the run's own value where it gives none), and four more:

    name    how its validation and test scores are reported (default ``<src_lang>-<tgt_lang>``; unique)
    weight  its share of the training stream relative to its size (default 1.0; > 0)
    tag     a token ``<tag>`` put in front of every one of its sources (e.g. ``bt`` for back-translation)
    test_sets  more test sets of its own, name: file prefix (reported as ``<name>.<set>``)

How much of each an epoch holds: ``training/mixing.py``.

**Multilingual**: when the corpora have more than one target language, every source starts with the token of
its target language, ``<2xx>`` (Johnson et al., 2017), then its tag. Both are user-defined pieces of the
run's SentencePiece model, which is learnt from an equal number of sentences of every language.
"""

import dataclasses
import re
import typing
from dataclasses import dataclass

from transformer.core.config import ConfigError, coerce_value
from transformer.runtime.configs import DataConfig

CORPUS_KEYS = ("dataset", "src_lang", "tgt_lang", "data_dir", "hub_name", "hub_config", "text_prefix",
               "train_prefix", "valid_prefix", "test_prefix", "valid_size", "test_size", "split_seed",
               "max_len", "max_ratio", "dedup", "train_limit", "eval_limit", "test_sets")  # fmt: skip
OWN_KEYS = {"name": str, "weight": float, "tag": str}
WHERE_KEYS = ("text_prefix", "train_prefix", "valid_prefix", "test_prefix", "hub_name", "hub_config")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
TAG = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")  # never <2xx>, a language's token
RESERVED_TAGS = ("s", "pad", "unk")  # <s>, <pad>, <unk>: SentencePiece's own pieces


def language_piece(lang: str) -> str:
    """The target-language token of a multilingual model: ``<2fr>``."""
    return f"<2{lang}>"


def tag_piece(tag: str) -> str:
    return f"<{tag}>"


@dataclass(frozen=True)
class Part:
    """One corpus of a run: its name, settings (the run's data settings with its own keys), weight and tag."""

    name: str
    data: DataConfig
    weight: float = 1.0
    tag: str | None = None
    key: str = "data"  # where the config gives it, for error messages
    test_sets: dict = dataclasses.field(default_factory=dict)


def parts_of(data: DataConfig) -> list[Part]:
    """The corpora of a run: ``data.corpora``'s, checked (each error names its key), or the one corpus."""
    if not data.corpora:
        return [Part(f"{data.src_lang}-{data.tgt_lang}", data)]
    for key in WHERE_KEYS:
        if getattr(data, key) is not None:
            raise ConfigError(f"data.{key}={getattr(data, key)} with data.corpora: give it in its corpus")
    parts = [part_of(entry, i, data) for i, entry in enumerate(data.corpora)]
    for i, part in enumerate(parts):
        for other in parts[:i]:
            if part.name == other.name:
                raise ConfigError(f"{part.key}.name={part.name!r} is also {other.key}'s: a corpus's name "
                                  "names its scores, give each its own")  # fmt: skip
            if part.tag is not None and part.tag == other.tag:
                raise ConfigError(f"{part.key}.tag={part.tag!r} is also {other.key}'s: a tag marks one "
                                  "corpus (join their files, or give each its own tag)")  # fmt: skip
    return parts


def part_of(entry: dict, i: int, data: DataConfig) -> Part:
    where, hints = f"data.corpora[{i}]", typing.get_type_hints(DataConfig)
    values = {}
    for key, value in entry.items():
        if key not in CORPUS_KEYS and key not in OWN_KEYS:
            raise ConfigError(f"unknown key {where}.{key}; a corpus takes {', '.join(CORPUS_KEYS)}, "
                              f"{', '.join(OWN_KEYS)}")  # fmt: skip
        annotation = OWN_KEYS.get(key) or (dict[str, str] if key == "test_sets" else hints[key])
        values[key] = coerce_value(value, annotation, f"{where}.{key}")
    for key in ("src_lang", "tgt_lang"):
        if key not in values:
            raise ConfigError(f"{where}: no {key} (every corpus names its languages)")
    name = values.pop("name", f"{values['src_lang']}-{values['tgt_lang']}")
    weight, tag, test_sets = values.pop("weight", 1.0), values.pop("tag", None), values.pop("test_sets", {})
    if not NAME.fullmatch(name) or name in ("validation", "test"):
        raise ConfigError(f"{where}.name={name!r} is not a usable name (letters, digits, _ . -)")
    if not 0 < weight < float("inf"):
        raise ConfigError(f"{where}.weight={weight} must be > 0 and finite (leave a corpus out to drop it)")
    if tag is not None and (not TAG.fullmatch(tag) or tag in RESERVED_TAGS):
        raise ConfigError(f"{where}.tag={tag!r}: expected a name (letters, digits, _ . -) other than "
                          f"{', '.join(RESERVED_TAGS)}")  # fmt: skip
    try:
        own = dataclasses.replace(data, corpora=[], **values)
    except ConfigError as error:
        raise ConfigError(str(error).replace("data.", f"{where}.", 1)) from None
    return Part(name, own, weight, tag, where, test_sets)


def languages(parts: list[Part]) -> list[str]:
    """The target languages of a multilingual run (more than one), else []."""
    targets = sorted({part.data.tgt_lang for part in parts})
    return targets if len(targets) > 1 else []


def prefix_pieces(part: Part, parts: list[Part], marian: bool = False) -> list[str]:
    """The pieces in front of every source of ``part``: its target language's (multilingual; always for a
    model fine-tuned from a released multilingual Marian one, ``marian``: its ``>>xx<<``), then its tag."""
    if marian:
        pieces = [f">>{part.data.tgt_lang}<<"]
    else:
        pieces = [language_piece(part.data.tgt_lang)] if languages(parts) else []
    return pieces + ([tag_piece(part.tag)] if part.tag else [])


def user_symbols(parts: list[Part]) -> list[str]:
    """Every piece the run's tokenizer must hold as one user-defined piece, in a fixed order."""
    return sorted({piece for part in parts for piece in prefix_pieces(part, parts)})


def directions(data: DataConfig) -> list[tuple[str, str]]:
    """The directions a model was trained for, (source, target) in the config's order (a checkpoint's)."""
    return list(dict.fromkeys((part.data.src_lang, part.data.tgt_lang) for part in parts_of(data)))


# -------- the tokens in front of a source ----------------------------------------------------------------


def prefix_ids(part: Part, parts: list[Part], tokenizer) -> list[int]:
    """The ids of ``prefix_pieces``; a piece the tokenizer lacks as a piece of its own (one it learnt from
    text, or none: a given ``data.tokenizer`` or a fine-tuned model's) is a ``ConfigError`` naming the key."""
    ids, marian = [], bool(getattr(tokenizer, "language_pieces", list)())
    for piece in prefix_pieces(part, parts, marian):
        if (i := tokenizer.symbol_id(piece)) is None:
            key = f"{part.key}.tag" if piece == tag_piece(part.tag or "") else f"{part.key}.tgt_lang"
            raise ConfigError(
                f"{key}: the run's tokenizer has no user-defined piece {piece} (a word piece of "
                "that spelling would collide with it); train the tokenizer with these corpora"
            )
        ids.append(i)
    return ids


MARIAN_LANGUAGE = re.compile(r">>(.+)<<")  # a released multilingual Marian model's language tokens


def target_languages(data: DataConfig, tokenizer) -> dict[str, int]:
    """{target language: its token's id} of a multilingual model, {} of a bilingual one: a released Marian
    model's ``>>xx<<`` pieces (also of a model fine-tuned from it), else the target languages its config's
    corpora name (``<2xx>``)."""
    if pieces := getattr(tokenizer, "language_pieces", list)():
        return {MARIAN_LANGUAGE.fullmatch(piece).group(1): tokenizer.symbol_id(piece) for piece in pieces}
    langs = languages(parts_of(data)) if data.corpora else []
    return {lang: i for lang in langs if (i := tokenizer.symbol_id(language_piece(lang))) is not None}


def trained_target(data: DataConfig) -> str | None:
    """The one target language of a model of ours trained into one (its corpora's, or ``data.tgt_lang``)."""
    targets = {tgt for _, tgt in directions(data)}
    return targets.pop() if len(targets) == 1 else None
