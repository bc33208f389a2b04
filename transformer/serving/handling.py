"""What every route that translates shares: queue a job and wait for its answers or for its caller to hang
up; the refusals (one ``{"error": "..."}`` line and its status); JSON written off the event loop."""

import asyncio
import functools
import json

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from transformer.serving.batcher import Batcher, Job, QueueFull


class Error(BaseModel):
    """Every refusal and failure: one line saying what is wrong, naming the field when the input is."""

    error: str


ERRORS = {status: {"model": Error, "description": what} for status, what in [
    (401, "the API key is missing or wrong"), (413, "the body is over the size limit"),
    (422, "a field breaks a rule of the schema (named in the message)"),
    (500, "translating failed (one line; the service goes on)"),
    (503, "the queue is full: retry after Retry-After seconds"),
]}  # fmt: skip


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Refused(Exception):
    """A request that gets ``status`` and its one-line message (and ``headers``, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


async def run_job(batcher: Batcher, job: Job, request: Request) -> list:
    """Queue ``job`` and wait for its answers, or for its caller to hang up (then the job is dropped, if
    the worker has not started it). Refused: a full queue (503), bad input found while decoding (422), a
    failure (500)."""
    try:
        future = batcher.submit(job)
    except QueueFull as full:
        raise Refused(503, str(full), {"Retry-After": str(full.retry_after)}) from None
    answers = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answers, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answers.done():  # the caller left: nobody reads what we answer
        batcher.withdraw(job)  # dropped, unless the worker has started it
        answers.cancel()
        raise Refused(499, "the client closed the connection")
    try:
        return answers.result()
    except ValueError as error:  # the input, found out while decoding (e.g. a prefix)
        raise Refused(422, str(error)) from None
    except Exception as error:  # noqa: BLE001 -- one line for the caller; answers.py logged the traceback
        first_line = (str(error).splitlines() or [""])[0]
        raise Refused(500, f"translating failed: {type(error).__name__}: {first_line}") from None


async def _disconnected(request: Request) -> None:
    """Return when the client hangs up (the body has been read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def json_response(content, status: int = 200, large: bool = False) -> Response:
    """``content`` as JSON; ``large`` (attention weights): serialized in a thread, so that it does not stall
    the event loop (a small answer is written at once: a thread's round trip costs more than it)."""
    dumps = functools.partial(json.dumps, content, ensure_ascii=False, separators=(",", ":"))
    body = await asyncio.to_thread(dumps) if large else dumps()
    return Response(body.encode(), status_code=status, media_type="application/json")
