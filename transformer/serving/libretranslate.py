"""LibreTranslate's HTTP API under ``/libretranslate/``, so that its clients (browser extensions, chat and CMS
plug-ins, client libraries) can use this service as they are:

    POST /libretranslate/translate        q (a string or a list), source ("auto": the model's), target,
                                          format ("text"), alternatives, api_key -> {"translatedText": ...}
    GET  /libretranslate/languages        [{"code", "name", "targets"}]        (no key, as in LibreTranslate)
    GET  /libretranslate/frontend/settings  what LibreTranslate's page reads  (no key, as in LibreTranslate)

As LibreTranslate does, the fields may come as JSON, as a form (urlencoded or multipart; ``q`` repeated for
a list) or in the query string, and an error is ``{"error": "..."}`` with its status: 400 for the request,
403 for a wrong key, 503 for a full queue. The translations are the ones ``POST /translate`` gives with the
model's defaults; ``alternatives`` (n) are the next n of an n + 1-best list.
"""

import json
from typing import Annotated

from fastapi import Depends, FastAPI, Request, Response
from pydantic import BaseModel

from transformer.serving.batcher import Job
from transformer.serving.handling import ERRORS, Refused, json_response, run_job
from transformer.serving.schema import Limits, unicode_error, whole_number

LANGUAGES = """ar:Arabic cs:Czech da:Danish de:German el:Greek en:English es:Spanish fi:Finnish fr:French
hu:Hungarian it:Italian ja:Japanese ko:Korean nl:Dutch pl:Polish pt:Portuguese ro:Romanian ru:Russian
sv:Swedish tr:Turkish uk:Ukrainian zh:Chinese"""
NAMES = dict(pair.split(":") for pair in LANGUAGES.split())  # what /languages names; another code: itself


class Detected(BaseModel):
    language: str
    confidence: float


class Translated(BaseModel):
    """LibreTranslate's answer: for a list ``q``, lists in its order."""

    translatedText: str | list[str]
    alternatives: list[str] | list[list[str]] | None = None  # only when asked for
    detectedLanguage: Detected | list[Detected] | None = None  # only for source "auto"


async def fields(request: Request) -> dict:
    """The request's fields from its query string, then its JSON or form body (a repeated field: a list)."""
    query = request.query_params
    found = {key: _one_or_list(query.getlist(key)) for key in query}
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            body = json.loads(await request.body() or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            raise Refused(400, "Invalid JSON format") from None
        if not isinstance(body, dict):
            raise Refused(400, "Invalid JSON format")
        found |= body
    elif kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        found |= {key: _one_or_list([v for v in form.getlist(key) if isinstance(v, str)]) for key in form}
    return found


def _one_or_list(values: list[str]) -> str | list[str]:
    return values[0] if len(values) == 1 else values


def add_libretranslate_routes(app: FastAPI, limits: Limits, description: dict, default_beam: int) -> None:
    """The routes above, for the model ``description`` (``app.py``'s ``/model``: its directions) and these
    limits."""
    routes = [tuple(route) for route in description["directions"]]
    languages = language_list(routes)
    first_target = next(one for one in languages if one["code"] == routes[0][1])

    async def admitted(request: Request) -> dict:
        """The request's fields, once its key is checked as LibreTranslate does (400 none, 403 wrong)."""
        given = await fields(request)
        key = given.get("api_key")
        if "api_key" in given and not isinstance(key, str):
            raise Refused(400, "Invalid request: api_key must be a string")
        if not app.state.key.admits(request, key):
            if key is None and app.state.key.sent(request) is None:
                raise Refused(400, "Please contact the server operator to get an API key")
            raise Refused(403, "Invalid API key")
        return given

    Fields = Annotated[dict, Depends(admitted)]
    responses = {200: {"model": Translated}, 400: ERRORS[422] | {"description": "a bad request"},
                 403: ERRORS[401] | {"description": "the API key is wrong"}, 503: ERRORS[503],
                 500: ERRORS[500]}  # fmt: skip

    @app.post("/libretranslate/translate", response_model=None, responses=responses,
              openapi_extra=request_body(limits, routes))  # fmt: skip
    async def translate(request: Request, given: Fields) -> Response:
        """LibreTranslate's /translate: JSON, a form or the query string."""
        texts, alternatives, target = checked(given, limits, routes)
        n = alternatives + 1
        job = Job(texts, max(default_beam, n), n, target_lang=target)
        try:
            found = await run_job(app.state.batcher, job, request)
        except Refused as refused:  # LibreTranslate says 400 for what is wrong with the request
            raise Refused(
                400 if refused.status == 422 else refused.status, refused.message, refused.headers
            ) from None
        best = [hyps[0]["text"] if n > 1 else hyps["text"] for hyps in found]
        answer: dict = {"translatedText": best if isinstance(given["q"], list) else best[0]}
        if alternatives:
            others = [[h["text"] for h in hyps[1:]] for hyps in found]
            answer["alternatives"] = others if isinstance(given["q"], list) else others[0]
        if str(given["source"]).lower() == "auto":  # the model reads its source languages: nothing to detect
            detected = detected_language(routes, target)
            answer["detectedLanguage"] = [detected] * len(texts) if isinstance(given["q"], list) else detected
        return await json_response(answer)

    # as in LibreTranslate, the languages and settings need no key: clients read them before they have one
    @app.get("/libretranslate/languages")
    async def list_languages() -> list[dict]:
        return languages

    @app.get("/libretranslate/frontend/settings")
    async def frontend_settings() -> dict:
        required = app.state.key.required
        return {"charLimit": limits.max_chars, "frontendTimeout": 500, "apiKeys": required,
                "keyRequired": required, "suggestions": False, "filesTranslation": False,
                "supportedFilesFormat": [],
                "language": {"source": languages[0], "target": first_target}}  # fmt: skip


def detected_language(routes: list[tuple[str, str]], target: str) -> dict:
    """For source "auto": the one language the model translates into ``target`` from (confidence 100), or
    "auto" with confidence 0 where it reads several (a multilingual model needs no source language)."""
    sources = list(dict.fromkeys(src for src, tgt in routes if tgt == target))
    return (
        {"language": sources[0], "confidence": 100.0}
        if len(sources) == 1
        else {"language": "auto", "confidence": 0.0}
    )


def language_list(routes: list[tuple[str, str]]) -> list[dict]:
    """What /languages answers: every language of the model's directions, with the ones it translates into."""
    codes = list(dict.fromkeys(code for route in routes for code in route))
    targets = {code: [tgt for src, tgt in routes if src == code] for code in codes}
    return [{"code": code, "name": NAMES.get(code, code), "targets": targets[code]} for code in codes]


def checked(given: dict, limits: Limits, routes: list[tuple[str, str]]) -> tuple[list[str], int, str]:
    """The texts, the number of alternatives and the target language (as the model spells it) a request
    asks for; Refused (400) naming what is wrong. Language codes are matched whatever their case."""
    for name in ("q", "source", "target"):
        if name not in given:
            raise Refused(400, f"Invalid request: missing {name} parameter")
    q = given["q"]
    if q == "" or q == []:  # as LibreTranslate: nothing to translate is a missing q
        raise Refused(400, "Invalid request: missing q parameter")
    texts = q if isinstance(q, list) else [q]
    if not all(isinstance(text, str) for text in texts):
        raise Refused(400, "Invalid request: q must be a string or a list of strings")
    if len(texts) > limits.max_texts:
        raise Refused(400, f"Invalid request: {len(texts)} texts in q, over the limit of {limits.max_texts}")
    for n, text in enumerate(texts):
        where = "q" if isinstance(q, str) else f"q.{n}"
        if (problem := unicode_error(text)) is not None:
            raise Refused(400, f"Invalid request: {where} is {problem}")
        if len(text) > limits.max_chars:
            raise Refused(400, f"Invalid request: {where} has {len(text)} characters, over the limit of "
                               f"{limits.max_chars}")  # fmt: skip
    source, target = given["source"], given["target"]
    lower = [(src.lower(), tgt.lower()) for src, tgt in routes]
    allowed = {"source": ["auto"] + [src for src, _ in lower], "target": [tgt for _, tgt in lower]}
    for name, value in (("source", source), ("target", target)):
        if not isinstance(value, str) or value.lower() not in allowed[name]:
            raise Refused(400, f"{value} is not supported as {name}: {translates(routes)}")
    if source.lower() != "auto" and (source.lower(), target.lower()) not in lower:
        raise Refused(400, f"{source} to {target} is not supported: {translates(routes)}")
    if str(given.get("format", "text")).lower() != "text":
        raise Refused(400, f"{given['format']} format is not supported: this service translates text only")
    alternatives = whole_number(given.get("alternatives", 0))
    if isinstance(alternatives, str) and alternatives.isascii() and alternatives.isdigit():  # a form, a query
        alternatives = int(alternatives)
    if type(alternatives) is not int or not 0 <= alternatives < limits.max_beam:
        raise Refused(400, f"Invalid request: alternatives must be a number from 0 to {limits.max_beam - 1}")
    return texts, alternatives, routes[allowed["target"].index(target.lower())][1]


def translates(routes: list[tuple[str, str]]) -> str:
    return "this model translates " + ", ".join(f"{src} to {tgt}" for src, tgt in routes)


def request_body(limits: Limits, routes: list[tuple[str, str]]) -> dict:
    """The OpenAPI request body of /libretranslate/translate, as JSON (a form holds the same fields)."""
    text = {"type": "string", "maxLength": limits.max_chars}
    schema = {
        "type": "object",
        "required": ["q", "source", "target"],
        "properties": {
            "q": {
                "anyOf": [
                    text | {"minLength": 1},
                    {"type": "array", "items": text, "minItems": 1, "maxItems": limits.max_texts},
                ]
            },
            "source": {"enum": ["auto", *dict.fromkeys(src for src, _ in routes)]},
            "target": {"enum": list(dict.fromkeys(tgt for _, tgt in routes))},
            "format": {"enum": ["text"]},
            "alternatives": {"type": "integer", "minimum": 0, "maximum": limits.max_beam - 1},
            "api_key": {"type": "string"},
        },
    }
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
