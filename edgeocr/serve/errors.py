"""The one error shape every reply uses: `{"error": {"code": HTTP status, "type": slug, "message": text}}`."""

from __future__ import annotations

import json


class HTTPError(Exception):
    """A refusal with its HTTP status, a stable machine-readable type and a message naming what is wrong."""

    def __init__(self, status: int, type_: str, message: str, headers: dict | None = None, close: bool = False):
        super().__init__(message)
        self.status = status                 # HTTP status code
        self.type = type_                    # e.g. invalid_request, overloaded (stable, for clients)
        self.message = message               # human-readable, names the field or limit
        self.headers = headers or {}         # extra reply headers (Retry-After, WWW-Authenticate)
        self.close = close                   # close the connection after the reply (unread body)

    def body(self) -> bytes:
        return error_body(self.status, self.type, self.message)

    def as_dict(self) -> dict:
        return {"error": {"code": self.status, "type": self.type, "message": self.message}}


def error_body(status: int, type_: str, message: str) -> bytes:
    # ensure_ascii: the message may quote client input, which need not be valid Unicode
    return json.dumps({"error": {"code": status, "type": type_, "message": message}}).encode()


def bad_request(message: str, type_: str = "invalid_request") -> HTTPError:
    return HTTPError(400, type_, message)


def unavailable(type_: str, message: str, retry_after_s: float) -> HTTPError:
    """503 with the Retry-After every refusal of this kind carries."""
    return HTTPError(503, type_, message, {"Retry-After": str(max(1, int(round(retry_after_s))))})


def raw_reply(status: int, reason: str, type_: str, message: str, headers: dict | None = None) -> bytes:
    """A complete HTTP/1.1 reply for the connection layer (no request object yet): JSON body, then close."""
    body = error_body(status, type_, message)
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
