"""The service's routes: ``POST /translate``, ``GET /health``, ``GET /model``, the page at ``/``, the OpenAPI
schema and its page, and LibreTranslate's API under ``/libretranslate/`` (``libretranslate.py``).

Every route that translates or describes the model (all but ``/health``, the page and its files, and
LibreTranslate's language list) needs the API key when the service was given one (``keys.py``). A body over
the size limit is refused (413) before it is read whole; a malformed one gets a 4xx with a message naming
the field; a full queue a 503 with Retry-After; a failure while translating a 500 with one line: always
``{"error": "..."}``, and the service goes on.
"""

import asyncio
import dataclasses

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from transformer.inference.translator import Translator, model_languages
from transformer.interop.formats import load_model
from transformer.runtime.corpora import directions
from transformer.runtime.precision import resolve_device
from transformer.serving.batcher import Batcher, Job
from transformer.serving.handling import ERRORS, Refused, error_response, json_response, run_job
from transformer.serving.keys import ApiKey
from transformer.serving.libretranslate import add_libretranslate_routes
from transformer.serving.pages import add_pages
from transformer.serving.schema import Limits, request_model


class Service:
    """What the app serves: the model's description, filled in by the worker thread that loads it."""

    def __init__(self, checkpoint: str, device: str, precision: str):
        self.checkpoint, self.device, self.precision = checkpoint, device, precision
        self.config = None

    def make_translator(self) -> Translator:
        device = resolve_device(self.device)
        model, tokenizer, self.config = load_model(self.checkpoint, device)
        languages = model_languages(self.config, tokenizer, self.checkpoint)
        return Translator(model, tokenizer, self.config.eval, device, self.precision, **languages)

    def describe(self, translator: Translator, limits: Limits, max_queue: int) -> dict:
        config, model = self.config, translator.model
        trained, multilingual = translator.trained_target, bool(translator.languages)
        if config.data.corpora:  # ours, trained on several corpora
            routes = directions(config.data)
        elif multilingual:  # a released multilingual model: the targets of its >>xx<< tokens
            routes = [(config.data.src_lang, target) for target in translator.languages]
        else:  # one pair (a released model's languages are not recorded: the config's defaults)
            routes = [(config.data.src_lang, trained or config.data.tgt_lang)]
        return {
            "checkpoint": str(self.checkpoint),
            "source_language": routes[0][0] if len({s for s, _ in routes}) == 1 else None,
            "target_language": None if multilingual else routes[0][1],
            "multilingual": multilingual,  # then every request names its target_lang
            # what target_lang may be: a bilingual model's own language where it is recorded
            "target_languages": list(translator.languages) or ([trained] if trained else []),
            "directions": [list(route) for route in routes],
            "vocab_size": translator.tokenizer.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "architecture": dataclasses.asdict(config.model),
            "decoder_layers": len(model.decoder.layers),
            "heads": config.model.n_heads,
            "precision": self.precision,
            "device": str(translator.device),
            "evaluation": dataclasses.asdict(config.eval),
            "limits": limits.model_dump() | {"max_queue": max_queue},
        }


def field_errors(error: RequestValidationError) -> str:
    """Pydantic's errors as one line, each naming its field: "beam: Input should be ...; texts: ...". A texts
    entry is a string or {"text", "prefix", "constraints"}: of the two branches' errors, the one that fits
    what was sent."""
    items = error.errors()
    objects = {i["loc"][: i["loc"].index("SteeredText")] for i in items  # the entries sent as objects
               if "SteeredText" in i["loc"][:-1]}  # fmt: skip
    parts = []
    for item in items:
        loc, message = item["loc"], item["msg"].removeprefix("Value error, ")
        if "str" in loc or "SteeredText" in loc:
            branch = "str" if "str" in loc else "SteeredText"
            if loc[-1] == "SteeredText" or (branch == "str" and loc[: loc.index("str")] in objects):
                continue  # the other branch's error says it
            if branch == "str":
                message = 'Input should be a string or {"text", "prefix", "constraints"}'
            loc = tuple(x for x in loc if x != branch)
        where = ".".join(str(x) for x in loc if x != "body") or "body"
        if item["type"] == "json_invalid":
            where, message = "body", f"not valid JSON ({item.get('ctx', {}).get('error', message)})"
        elif item["type"] == "extra_forbidden":
            known = (
                "text, prefix, constraints"
                if len(loc) > 3
                else "texts, beam, nbest, with_scores, alignments, attention, target_lang"
            )
            message = f"unknown field (known: {known})"
        parts.append(message if item["type"] == "value_error" and where == "body" else f"{where}: {message}")
    return "; ".join(parts)


def create_app(
    checkpoint: str, device: str = "auto", precision: str = "auto", api_key: str | None = None,
    limits: Limits | None = None, max_wait_ms: float = 25.0, max_tokens: int = 8000, max_queue: int = 512,
) -> "BodyLimit":  # fmt: skip
    """The app for one model, its model loaded now, in the worker thread that will decode: a bad
    checkpoint, device or precision raises here (CheckpointError, DeviceError, ValueError)."""
    limits = limits or Limits()
    service = Service(checkpoint, device, precision)
    batcher = Batcher(service.make_translator, max_wait_ms, max_tokens, max_queue)
    translator = batcher.start()
    description = service.describe(translator, limits, max_queue)

    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(batcher.stop)  # the requests in flight are answered first

    # the OpenAPI schema and its page are routes of their own (pages.py), behind the API key like the rest
    app = FastAPI(title="transformer-mt translation service", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)  # fmt: skip
    app.state.batcher, app.state.key = batcher, ApiKey(api_key)

    async def authorized(request: Request) -> None:
        if not app.state.key.admits(request):
            raise HTTPException(401, "Authorization: Bearer KEY is missing or wrong")

    add_error_handlers(app)
    body_model = request_model(limits, translator.settings.beam_size, translator.language_ids, description)
    add_api_routes(app, authorized, body_model, description)
    add_libretranslate_routes(app, limits, description, translator.settings.beam_size)
    add_pages(app, authorized)
    return BodyLimit(app, limits.max_body_bytes)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        return error_response(422, field_errors(error))

    @app.exception_handler(HTTPException)  # FastAPI's and Starlette's own (404, 405)
    async def refused(request: Request, error: HTTPException):
        if error.status_code == 400 and error.detail == "There was an error parsing the body":
            return error_response(422, "body: not valid JSON (not UTF-8 text, or nested too deep)")
        return error_response(error.status_code, str(error.detail), error.headers)

    @app.exception_handler(Refused)
    async def refused_job(request: Request, error: Refused):
        return error_response(error.status, error.message, error.headers)


def add_api_routes(app: FastAPI, authorized, TranslateRequest: type[BaseModel], description: dict) -> None:
    batcher = app.state.batcher

    @app.post("/translate", dependencies=[Depends(authorized)], responses=ERRORS)
    async def translate(body: TranslateRequest, request: Request) -> Response:
        """One answer per text, in order: {"text"} (+ "score", "alignment", "attention" when asked); with
        nbest > 1 a list of them, best first. A text may be {"text", "prefix", "constraints"}: its
        translation then starts with the prefix and holds each constraint phrase ("met": false when none
        within the length limit could). "attention" is every layer's and head's cross-attention, as float16
        base64 with its shape [layers, heads, target pieces, source pieces]. "target_lang": the language to
        translate into, one of /model's target_languages (needed by a multilingual model)."""
        job = Job(body.sources, body.beam, body.nbest, body.with_scores, body.alignments, body.attention,
                  body.prefixes, body.target_lang, body.constraints)  # fmt: skip
        translations = await run_job(batcher, job, request)
        return await json_response({"translations": translations}, large=body.attention)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/model", dependencies=[Depends(authorized)], responses={401: ERRORS[401]})
    async def model() -> dict:
        return description


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413 (and close the connection): at once when its
    Content-Length says so; a chunked body (Transfer-Encoding, whatever its Content-Length claims) is read
    here up to the limit, refused as soon as it passes it, else handed on."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit
        self.state = app.state  # the app's batcher and key, for serve.py and the tests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = error_response(
            413, f"body: over the limit of {self.limit} bytes", {"Connection": "close"}
        )
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and b"transfer-encoding" not in headers:  # else the body is chunked
            if length.isdigit() and int(length) > self.limit:
                return await too_large(scope, receive, send)
            return await self.app(scope, receive, send)
        chunks, received = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > self.limit:
                return await too_large(scope, receive, send)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay():
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()

        await self.app(scope, replay, send)
