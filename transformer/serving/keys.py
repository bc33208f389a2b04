"""The API key: compared as bytes, in constant time, from wherever a client can send it.

    Authorization: Bearer KEY     what programs and the page send (the header's bytes: any UTF-8 key works)
    api_key (query, form, JSON)   what LibreTranslate's clients send (libretranslate.py)
    cookie transformer_mt_docs    only for GET /docs and /openapi.json, which a browser opens without a
                                  header: set by POST /docs/access (the page calls it once it has the key),
                                  HttpOnly and SameSite=Strict, and not the key itself but an HMAC of it that
                                  opens nothing else

A header that is not UTF-8, or any other byte string, is a wrong key (401), never an error.
"""

import hashlib
import hmac
import logging
import re

from starlette.requests import Request

DOCS_COOKIE = "transformer_mt_docs"


class ApiKey:
    """The service's key, or None: every request is let in."""

    def __init__(self, key: str | None):
        self.expected = None if key is None else key.encode("utf-8")
        self.docs_token = (
            None if key is None else hmac.new(self.expected, b"docs", hashlib.sha256).hexdigest()
        )

    @property
    def required(self) -> bool:
        return self.expected is not None

    def matches(self, given: bytes | str | None) -> bool:
        if given is None:
            return False
        if isinstance(given, str):
            given = given.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(given, self.expected)

    def sent(self, request: Request) -> bytes | None:
        """The key a request carries in its Authorization header (None: no header)."""
        for name, value in request.scope["headers"]:
            if name == b"authorization":
                scheme, _, key = value.partition(b" ")
                return key.strip() if scheme.lower() == b"bearer" else value
        return None

    def admits(self, request: Request, api_key: str | None = None) -> bool:
        """Whether ``request`` (or its LibreTranslate ``api_key`` field) carries the key."""
        if self.expected is None:
            return True
        return self.matches(self.sent(request)) or self.matches(api_key)

    def admits_docs(self, request: Request) -> bool:
        """Whether ``request`` may read the schema and its page: the key, or the docs cookie."""
        if self.admits(request):
            return True
        cookie = request.cookies.get(DOCS_COOKIE, "")
        return hmac.compare_digest(cookie.encode("ascii", "replace"), self.docs_token.encode())


class HiddenKeys(logging.Filter):
    """The access log without the values of ``api_key`` in query strings (LibreTranslate's clients put the
    key there): a log line is not a place for a secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(re.sub(r"(?i)(api_key=)[^&\s]*", r"\1***", a) if isinstance(a, str) else a
                                for a in record.args)  # fmt: skip
        return True
