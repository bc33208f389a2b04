"""The service's routes: ``POST /translate``, ``GET /health``, ``GET /model`` and the page at ``/``.

Every route but ``/health`` needs ``Authorization: Bearer KEY`` when the service was given an API key. A
body over the size limit is refused (413) before it is read whole; a malformed one gets 4xx with a message
naming the field, and the service goes on.
"""

import asyncio
import dataclasses
import secrets
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse

from transformer.inference.translator import Translator
from transformer.serving.batcher import Batcher, Job
from transformer.serving.schema import Limits, request_model
from transformer.training.model_formats import load_model

STATIC = Path(__file__).with_name("static")
STATIC_FILES = ("page.js", "page.css")  # what the page loads besides index.html


class Service:
    """What the app serves: the model's description, filled in by the worker thread that loads it."""

    def __init__(self, checkpoint: str, device: str, precision: str):
        self.checkpoint, self.device, self.precision = checkpoint, device, precision
        self.config = None

    def make_translator(self) -> Translator:
        model, tokenizer, self.config = load_model(self.checkpoint, self.device)
        return Translator(model, tokenizer, self.config.eval, self.device, self.precision)

    def describe(self, translator: Translator) -> dict:
        config, model = self.config, translator.model
        return {
            "checkpoint": str(self.checkpoint),
            "source_language": config.data.src_lang,
            "target_language": config.data.tgt_lang,
            "vocab_size": translator.tokenizer.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "architecture": dataclasses.asdict(config.model),
            "decoder_layers": len(model.decoder.layers),
            "heads": config.model.n_heads,
            "precision": self.precision,
            "device": str(translator.device),
            "evaluation": dataclasses.asdict(config.eval),
        }


def field_errors(error: RequestValidationError) -> str:
    """Pydantic's errors as one line, each naming its field: "beam: Input should be ...; texts: ..."."""
    parts = []
    for item in error.errors():
        where = ".".join(str(x) for x in item["loc"] if x != "body") or "body"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "json_invalid":
            where, message = "body", f"not valid JSON ({item.get('ctx', {}).get('error', message)})"
        elif item["type"] == "extra_forbidden":
            message = "unknown field (known: texts, beam, nbest, with_scores, alignments, attention, prefix)"
        parts.append(message if item["type"] == "value_error" and where == "body" else f"{where}: {message}")
    return "; ".join(parts)


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413: at once when its Content-Length says so, else as
    soon as the bytes received pass the limit (a chunked body), without reading the rest."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = JSONResponse({"error": f"body: over the limit of {self.limit} bytes"}, status_code=413)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await too_large(scope, receive, send)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await too_large(scope, receive, send)


class _TooLarge(Exception):
    pass


def create_app(
    checkpoint: str, device: str = "cpu", precision: str = "auto", api_key: str | None = None,
    limits: Limits | None = None, max_wait_ms: float = 25.0, max_tokens: int = 8000,
) -> FastAPI:  # fmt: skip
    """The app for one model. The model is loaded when the app starts, in the worker thread that decodes."""
    limits = limits or Limits()
    service = Service(checkpoint, device, precision)
    batcher = Batcher(service.make_translator, max_wait_ms, max_tokens)
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        translator = await asyncio.to_thread(batcher.start)
        state["model"] = service.describe(translator)
        yield
        await asyncio.to_thread(batcher.stop)  # the requests in flight are answered first

    # the OpenAPI schema and its page are routes of their own below, behind the API key like the rest
    title = "transformer-mt translation service"
    app = FastAPI(title=title, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.batcher = batcher
    TranslateRequest = request_model(limits)

    async def authorized(authorization: str | None = Header(None)) -> None:
        if api_key is not None and not secrets.compare_digest(authorization or "", f"Bearer {api_key}"):
            raise HTTPException(401, "Authorization: Bearer KEY is missing or wrong")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        return JSONResponse({"error": field_errors(error)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, error: HTTPException):
        return JSONResponse({"error": error.detail}, status_code=error.status_code)

    @app.post("/translate", dependencies=[Depends(authorized)])
    async def translate(body: TranslateRequest) -> dict:
        """One answer per text, in order: {"text"} (+ "score", "alignment", "attention" when asked); with
        nbest > 1 a list of them, best first."""
        job = Job(body.texts, body.beam, body.nbest, body.with_scores, body.alignments, body.attention,
                  body.prefix)  # fmt: skip
        try:
            translations = await asyncio.wrap_future(batcher.submit(job))
        except ValueError as error:  # e.g. a prefix the tokenizer cannot encode
            raise HTTPException(422, str(error)) from None
        return {"translations": translations}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/model", dependencies=[Depends(authorized)])
    async def model() -> dict:
        return state["model"]

    add_pages(app, authorized)
    return BodyLimit(app, limits.max_body_bytes)


def add_pages(app: FastAPI, authorized) -> None:
    """The routes a browser reads: the page and its files, the OpenAPI schema and its page, each behind the
    API key (the ``authorized`` dependency)."""

    @app.get("/", dependencies=[Depends(authorized)], include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html")

    @app.get("/openapi.json", dependencies=[Depends(authorized)], include_in_schema=False)
    async def openapi() -> dict:
        return app.openapi()

    @app.get("/docs", dependencies=[Depends(authorized)], include_in_schema=False)
    async def docs():  # Swagger UI, its script from its CDN: the one page here that needs the network
        return get_swagger_ui_html(openapi_url="/openapi.json", title=app.title)

    @app.get("/static/{name}", dependencies=[Depends(authorized)], include_in_schema=False)
    async def static(name: str):
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no file {name}")
        return FileResponse(STATIC / name)
