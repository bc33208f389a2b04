"""What a request may hold, checked field by field (an unknown field is refused by name), and its limits.

The OpenAPI document states every rule the handler checks, so that a client generated from it, or a fuzzer
driven by it, never meets a refusal the document did not announce: lengths and ranges as JSON Schema
keywords, and the two rules that tie fields together as ``anyOf`` branches:
  - ``nbest`` at most ``beam`` (one branch per value of ``nbest``);
  - with ``attention``, at most ``max_attention_texts`` texts of at most ``max_attention_chars`` characters
    each (the weights grow as layers x heads x target x source: these bound the answer's size).
A text's prefix and constraints travel with it (``{"text": ..., "prefix": ..., "constraints": [...]}``), so
there is nothing to count.
"""

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator


class Limits(BaseModel):
    """The service's limits (``serve.py`` flags): refused above them with a 4xx naming the field."""

    max_texts: int = 64  # texts per request
    max_chars: int = 2000  # characters per text, per prefix and per constraint
    max_constraints: int = 8  # constraint phrases per text
    max_beam: int = 16
    max_attention_texts: int = 4  # texts per request that asks for attention
    max_attention_chars: int = 300  # characters per text and prefix of a request that asks for attention
    max_body_bytes: int = 1 << 20  # a body over this is refused before it is read whole


def unicode_error(text: str) -> str | None:
    """Why ``text`` is not valid Unicode (a lone surrogate: JSON's ``\\ud800`` escapes allow one), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (
            f"not valid Unicode (a lone surrogate U+{ord(text[error.start]):04X} at character {error.start})"
        )
    return None


def whole_number(value):
    """JSON's integers: 4 and 4.0 (JSON Schema counts both as integers), not "4" or true."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Integer = Annotated[int, BeforeValidator(whole_number)]


# A constraint holds a character that is neither white space nor a control or zero-width one: the target
# tokenizer keeps it, so the phrase has at least one piece.
PHRASE = "[^\\s\\u0000-\\u001f\\u007f-\\u009f\\u200b-\\u200f\\u2028-\\u202f\\u2060-\\u206f\\ufeff]"


class SteeredText(BaseModel):
    """A text whose translation must start with ``prefix`` and contain each of ``constraints`` (target
    text, exact to the sub-word)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    prefix: str = ""
    constraints: list[str] = []


def text_schema(limits: Limits, max_chars: int) -> dict:
    """A texts entry: a string, or an object with its prefix and constraints, each of at most ``max_chars``
    characters."""
    string = {"type": "string", "maxLength": max_chars}
    phrase = {"type": "string", "maxLength": max_chars, "pattern": PHRASE}
    phrases = {"type": "array", "items": phrase, "maxItems": limits.max_constraints}
    steered = {"type": "object", "properties": {"text": string, "prefix": string, "constraints": phrases},
               "required": ["text"], "additionalProperties": False}  # fmt: skip
    return {"anyOf": [string, steered]}


def cross_field_rules(limits: Limits, default_beam: int) -> list[dict]:
    """The rules between fields, as JSON Schema (see the module docstring): every one must hold."""
    nbest = [{"properties": {"nbest": {"maximum": 1}}}]  # absent or 1: any beam
    for n in range(2, limits.max_beam + 1):
        branch = {"properties": {"nbest": {"const": n}, "beam": {"minimum": n}}, "required": ["nbest"]}
        if n > default_beam:  # the default beam is too small: beam must be given
            branch["required"] = ["nbest", "beam"]
        nbest.append(branch)
    small = {"type": "array", "maxItems": limits.max_attention_texts,
             "items": text_schema(limits, limits.max_attention_chars)}  # fmt: skip
    attention = [{"properties": {"attention": {"const": False}}}, {"properties": {"texts": small}}]
    return [{"anyOf": nbest}, {"anyOf": attention}]


def check_texts(texts: list, chars: int, attention: bool, limits: Limits) -> None:
    """Each text, prefix and constraint valid Unicode of at most ``chars`` characters, at most
    ``max_constraints`` constraints a text, each with a character the tokenizer keeps; else a ValueError
    naming it."""
    for n, entry in enumerate(texts):
        fields = {"": entry} if isinstance(entry, str) else {".text": entry.text, ".prefix": entry.prefix}
        phrases = [] if isinstance(entry, str) else entry.constraints
        if len(phrases) > limits.max_constraints:
            raise ValueError(f"texts.{n}.constraints: {len(phrases)} phrases, over the limit of "
                             f"{limits.max_constraints}")  # fmt: skip
        for j, phrase in enumerate(phrases):
            if not re.search(PHRASE, phrase):
                raise ValueError(f"texts.{n}.constraints.{j}: no character the tokenizer keeps")
            fields[f".constraints.{j}"] = phrase
        for name, text in fields.items():
            where = f"texts.{n}{name}"
            if (problem := unicode_error(text)) is not None:
                raise ValueError(f"{where}: {problem}")
            if len(text) > chars:
                with_attention = " with attention" if attention else ""
                raise ValueError(
                    f"{where}: {len(text)} characters, over the limit of {chars}{with_attention}"
                )


def language_rule(schema: dict, description: dict) -> None:
    """``target_lang`` in the schema: one of a multilingual model's target languages, required; a bilingual
    model's own, or none."""
    targets = description.get("target_languages") or []
    if description.get("multilingual", False):
        schema["properties"]["target_lang"] = {"enum": targets}
        schema["required"] = [*schema.get("required", []), "target_lang"]
    elif targets:
        schema["properties"]["target_lang"] = {
            "anyOf": [{"enum": targets}, {"type": "null"}],
            "default": None,
        }


def request_model(
    limits: Limits, default_beam: int = 1, check_language=None, description: dict | None = None
) -> type[BaseModel]:
    """The ``POST /translate`` body for these limits; ``beam`` defaults to the model's ``eval.beam_size``;
    ``target_lang`` is checked by ``check_language`` (``Translator.language_ids``: a ValueError naming the
    choices) against the model's ``description`` (its target languages; required where there are several)."""
    default_beam = min(default_beam, limits.max_beam)

    def add_rules(schema: dict) -> None:
        schema["properties"]["texts"]["items"] = text_schema(limits, limits.max_chars)
        schema["allOf"] = cross_field_rules(limits, default_beam)
        language_rule(schema, description or {})

    class TranslateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=add_rules)

        texts: list[str | SteeredText] = Field(min_length=1, max_length=limits.max_texts)
        beam: Integer = Field(default_beam, ge=1, le=limits.max_beam)
        nbest: Integer = Field(1, ge=1, le=limits.max_beam)
        with_scores: bool = False
        alignments: bool = False
        attention: bool = False  # every layer's and head's cross-attention weights (answers.py: the format)
        target_lang: str | None = None  # the language to translate into (a multilingual model needs it)

        @model_validator(mode="after")
        def consistent(self):
            chars = limits.max_attention_chars if self.attention else limits.max_chars
            if self.attention and len(self.texts) > limits.max_attention_texts:
                raise ValueError(f"texts: {len(self.texts)} texts with attention, over the limit of "
                                 f"{limits.max_attention_texts}")  # fmt: skip
            check_texts(self.texts, chars, self.attention, limits)
            if self.nbest > self.beam:
                raise ValueError(f"nbest: {self.nbest} is more than beam={self.beam}: give beam >= nbest")
            if check_language is not None:
                try:
                    check_language(self.target_lang)
                except ValueError as error:
                    raise ValueError(f"target_lang: {error}") from None
            return self

        @property
        def sources(self) -> list[str]:
            return [entry if isinstance(entry, str) else entry.text for entry in self.texts]

        @property
        def prefixes(self) -> list[str] | None:
            """Per text its prefix ("" for none); None when no text has one."""
            if all(isinstance(entry, str) or not entry.prefix for entry in self.texts):
                return None
            return ["" if isinstance(entry, str) else entry.prefix for entry in self.texts]

        @property
        def constraints(self) -> list[list[str]] | None:
            """Per text its constraints ([] for none); None when no text has one."""
            if all(isinstance(entry, str) or not entry.constraints for entry in self.texts):
                return None
            return [[] if isinstance(entry, str) else list(entry.constraints) for entry in self.texts]

    return TranslateRequest
