"""What a request may hold, checked field by field (an unknown field is refused by name), and its limits."""

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Limits(BaseModel):
    """The service's limits (``serve.py`` flags): refused above them with a 4xx naming the field."""

    max_texts: int = 64  # texts per request
    max_chars: int = 2000  # characters per text
    max_beam: int = 16
    max_body_bytes: int = 1 << 20  # a body over this is refused before it is read whole


def request_model(limits: Limits) -> type[BaseModel]:
    """The ``POST /translate`` body for these limits."""

    class TranslateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        texts: list[str] = Field(min_length=1, max_length=limits.max_texts)
        beam: int = Field(1, ge=1, le=limits.max_beam)
        nbest: int = Field(1, ge=1)
        with_scores: bool = False
        alignments: bool = False
        attention: bool = False
        prefix: list[str] | None = None  # per text, target text its translation starts with ("" = none)

        @model_validator(mode="after")
        def consistent(self):
            for n, text in enumerate(self.texts):
                if len(text) > limits.max_chars:
                    raise ValueError(
                        f"texts.{n}: {len(text)} characters, over the limit of {limits.max_chars}"
                    )
            if self.nbest > self.beam:
                raise ValueError(f"nbest: {self.nbest} is more than beam={self.beam}: give beam >= nbest")
            if self.prefix is not None and len(self.prefix) != len(self.texts):
                raise ValueError(
                    f"prefix: {len(self.prefix)} entries for {len(self.texts)} texts: one per text"
                )
            return self

    return TranslateRequest
