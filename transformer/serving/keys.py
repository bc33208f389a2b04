"""The API key: compared as bytes, in constant time, from wherever a client can send it.

    Authorization: Bearer KEY     what programs send (the header's bytes: any UTF-8 key works)
    cookie transformer_mt_key     what the page sets once its user typed the key (SameSite=Strict: another
                                  site's page cannot make the browser send it), so that /docs works too
    api_key (query, form, JSON)   what LibreTranslate's clients send (libretranslate.py)

A header that is not UTF-8, or any other byte string, is a wrong key (401), never an error.
"""

import hmac
from urllib.parse import unquote_to_bytes

from starlette.requests import Request

COOKIE = "transformer_mt_key"


class ApiKey:
    """The service's key, or None: every request is let in."""

    def __init__(self, key: str | None):
        self.expected = None if key is None else key.encode("utf-8")

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
        """The key a request carries in its Authorization header or the page's cookie (None: neither)."""
        for name, value in request.scope["headers"]:
            if name == b"authorization":
                scheme, _, key = value.partition(b" ")
                return key.strip() if scheme.lower() == b"bearer" else value
        cookie = request.cookies.get(COOKIE)
        return None if cookie is None else unquote_to_bytes(cookie)

    def admits(self, request: Request, api_key: str | None = None) -> bool:
        """Whether ``request`` (or its LibreTranslate ``api_key`` field) carries the key."""
        if self.expected is None:
            return True
        return self.matches(self.sent(request)) or self.matches(api_key)
