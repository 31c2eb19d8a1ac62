"""A minimal stdlib client for `unix:/path/to.sock` or `http://host:port` daemons (CLI --remote, doctor)."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

from edgeocr.errors import EdgeOCRError
from edgeocr.prompts import DEFAULT_TASK


def client_request(address: str, method: str, path: str, body: bytes | None = None,
                   headers: dict | None = None, timeout: float = 300.0) -> tuple[int, bytes]:
    """One request; returns (status, body).  Raises OSError when the daemon cannot be reached."""
    conn = _connection(address, timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _connection(address: str, timeout: float) -> http.client.HTTPConnection:
    if address.startswith("unix:"):
        sock_path = "/" + address[5:].lstrip("/")

        class UnixConnection(http.client.HTTPConnection):
            def connect(self):
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(sock_path)

        return UnixConnection("localhost", timeout=timeout)
    problem = address_problem(address)
    if problem:
        raise OSError(problem)
    u = urlparse(address)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def address_problem(address: str) -> str | None:
    """Why no daemon can be reached at `address` whatever runs (a message), or None for a well-formed one."""
    if address.startswith("unix:"):
        return None if address[5:].strip("/") else f"daemon address {address!r}: unix: needs a socket path"
    try:
        u = urlparse(address)
        u.port                                               # noqa: B018 (raises for a port out of range)
    except ValueError as e:
        return f"daemon address {address!r}: {e}; use unix:/path.sock or http://HOST:PORT"
    if u.scheme != "http" or not u.hostname:
        return f"daemon address {address!r}: use unix:/path.sock or http://HOST:PORT"
    return None


class RemoteError(EdgeOCRError):
    """The daemon refused a page; the message is the daemon's."""


class DaemonUnreachable(EdgeOCRError):
    """No daemon answers at the address."""


class _Reply:
    """A daemon's /v1/ocr reply where `edgeocr run` expects an OCRResult (PageOutcome.record)."""

    def __init__(self, d: dict):
        self.d = d

    def to_dict(self) -> dict:
        return {k: v for k, v in self.d.items() if k != "id"}


class RemoteOCR:
    """A running daemon as `edgeocr run --remote` uses it: one POST /v1/ocr per page, the page sent encoded
    (an image file's own bytes; a PDF page rendered by the caller's PageLoader)."""

    RETRIES = 5                                  # attempts when the daemon's queue is full (503 + Retry-After)

    def __init__(self, address: str, api_key_file: str | None = None):
        self.address = address
        self.headers = {"Content-Type": "application/json"}
        if api_key_file:
            try:
                key = Path(api_key_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as e:
                raise EdgeOCRError(f"--api-key-file {api_key_file}: {getattr(e, 'strerror', None) or e}") from None
            self.headers["Authorization"] = "Bearer " + key

    def recognize(self, data: bytes, task: str | None, prompt: str | None, lang: str, max_new_tokens: int) -> dict:
        """The daemon's reply for one encoded page; RemoteError when it refuses the page."""
        body = {"image": base64.b64encode(data).decode(), "max_new_tokens": max_new_tokens, "lang": lang}
        if prompt:
            body["prompt"] = prompt
        else:
            body["task"] = task or DEFAULT_TASK
        raw_body = json.dumps(body).encode()
        for attempt in range(self.RETRIES):
            try:
                code, raw, retry_after = _request(self.address, "POST", "/v1/ocr", raw_body, self.headers)
            except OSError as e:
                raise DaemonUnreachable(f"daemon at {self.address} unreachable ({e})") from None
            if code == 503 and retry_after is not None and attempt + 1 < self.RETRIES:
                time.sleep(min(float(retry_after), 30.0))
                continue
            break
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        if code != 200 or not isinstance(reply, dict):
            err = reply.get("error", {}) if isinstance(reply, dict) else {}
            raise RemoteError(f"daemon: {err.get('message') or raw[:200].decode('utf-8', 'replace')} "
                              f"(HTTP {code} {err.get('type', '')})".rstrip())
        return reply

    def run_pages(self, refs, loader, on_page, task=None, prompt=None, lang="zh", max_new_tokens=1024,
                  stop=None) -> None:
        """Like edgeocr.batchrun.run_pages, page by page through the daemon: on_page(PageOutcome) for each
        page, an error outcome for a page that cannot be read here or that the daemon refuses."""
        from edgeocr.batchrun import PageOutcome

        for ref in refs:
            if stop is not None and stop.is_set():
                return
            t0 = time.perf_counter()
            try:
                data = loader.load_encoded(ref)
                load_ms = (time.perf_counter() - t0) * 1e3
                reply = self.recognize(data, task, prompt, lang, max_new_tokens)
            except DaemonUnreachable:
                raise
            except EdgeOCRError as e:
                on_page(PageOutcome(ref, error=e, load_ms=(time.perf_counter() - t0) * 1e3))
                continue
            on_page(PageOutcome(ref, result=_Reply(reply), load_ms=load_ms))


def _request(address: str, method: str, path: str, body: bytes, headers: dict,
             timeout: float = 300.0) -> tuple[int, bytes, str | None]:
    """(status, body, Retry-After header or None)."""
    conn = _connection(address, timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Retry-After")
    finally:
        conn.close()
