"""Connection-level limits on top of uvicorn's h11 protocol.

uvicorn parses HTTP/1.1 (h11: Content-Length and chunked framing, header size cap) and closes idle
keep-alive connections.  This subclass adds what a hostile client would otherwise get away with:
- a header deadline: request line and headers must arrive within `header_timeout_s` (slowloris), 408;
- a cap on open connections: the one over `max_connections` gets 503 + Retry-After and is closed;
- a send deadline: a client that reads nothing of a reply for `send_timeout_s` is dropped;
- malformed HTTP (bad Content-Length, oversized headers, garbage) is answered in the JSON error shape;
- a lingering close: when a reply goes out before the request body was read (413, 503), the rest of
  the body is read and thrown away for a moment, so the client sees the reply instead of a reset.
Body size and body read deadlines are enforced by the application as the body arrives (app.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from edgeocr.serve.errors import error_body, raw_reply

log = logging.getLogger("edgeocr.serve")

MAX_HEADER_BYTES = 16 * 1024            # request line + headers; larger -> 400 (h11's incomplete-event cap)
LINGER_S = 2.0                          # how long an unread body is drained after an early reply, seconds
LINGER_MAX_BYTES = 256 * 1024 * 1024    # ... and at most this much of it


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float      # request line + headers must be complete within this, seconds
    send_timeout_s: float        # a reply the client does not read for this long drops the connection, seconds
    max_connections: int         # open connections; the next one gets 503
    retry_after_s: int = 2       # Retry-After on the connection-cap 503


class _LingeringTransport:
    """The protocol's view of its transport: close() half-closes and drains the unread request body first."""

    def __init__(self, transport, protocol: "EdgeProtocol"):
        self._t = transport
        self._p = protocol

    def __getattr__(self, name):
        return getattr(self._t, name)

    def is_closing(self) -> bool:
        return self._p.lingering or self._t.is_closing()

    def close(self) -> None:
        if self._p.lingering or self._t.is_closing():
            return
        if self._p.conn.their_state in (h11.SEND_BODY, h11.ERROR) and self._t.can_write_eof():
            self._p.linger()
        else:
            self._t.close()


def make_protocol(limits: ConnectionLimits, metrics=None) -> type:
    """The protocol class for uvicorn's `http=` setting, bound to these limits."""

    class _Protocol(EdgeProtocol):
        pass

    _Protocol.limits = limits
    _Protocol.metrics = metrics
    return _Protocol


class EdgeProtocol(H11Protocol):
    limits: ConnectionLimits
    metrics = None

    def connection_made(self, transport) -> None:
        self.lingering = False
        self._header_timer = self._send_timer = self._linger_timer = None
        self._got_bytes = False          # bytes of the current request's head have arrived
        self._lingered = 0
        super().connection_made(_LingeringTransport(transport, self))
        if len(self.connections) > self.limits.max_connections:
            self._refuse("too_many_connections", 503, "Service Unavailable", "overloaded",
                         f"too many open connections ({self.limits.max_connections})",
                         {"Retry-After": str(self.limits.retry_after_s)})
            return
        self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        for t in (self._header_timer, self._send_timer, self._linger_timer):
            if t is not None:
                t.cancel()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ reading
    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self._lingered += len(data)
            if self._lingered > LINGER_MAX_BYTES:
                self.transport._t.close()
            return
        self._got_bytes = True
        super().data_received(data)
        self._head_done_check()

    def eof_received(self):
        if self.lingering:
            self.transport._t.close()
        return None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._got_bytes = False
        self._head_done_check()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm_header_timer()

    def _head_done_check(self) -> None:
        if self.conn.their_state is not h11.IDLE and self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._on_header_timeout)

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._got_bytes:           # a request started but its head never completed
            self._refuse("header_timeout", 408, "Request Timeout", "request_timeout",
                         f"request line and headers not received within {self.limits.header_timeout_s:g} s")
        else:                         # a connection that never said anything: just close it
            self.transport._t.close()

    def send_400_response(self, msg: str) -> None:
        """Malformed HTTP (h11 refused it): the JSON error shape instead of uvicorn's plain text."""
        if self.metrics is not None:
            self.metrics.refused("malformed")
        log.info("- %s - 400 malformed HTTP request", self._peer())
        body = error_body(400, "bad_http", "malformed HTTP request: bad request line, header, Content-Length "
                                           f"or chunked framing, or headers over {MAX_HEADER_BYTES} bytes")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:    # h11 will not send a response in this state: raw bytes then
            self.transport.write(raw_reply(400, "Bad Request", "bad_http", "malformed HTTP request"))
        self.transport.close()

    # ------------------------------------------------------------------ writing
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._on_send_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _on_send_stalled(self) -> None:
        self._send_timer = None
        if self.metrics is not None:
            self.metrics.refused("send_stalled")
        log.info("- %s - client read nothing for %g s: connection dropped", self._peer(), self.limits.send_timeout_s)
        self.transport._t.abort()

    # ------------------------------------------------------------------ closing
    def _refuse(self, reason: str, status: int, phrase: str, type_: str, message: str, headers=None) -> None:
        if self.metrics is not None:
            self.metrics.refused(reason)
        log.info("- %s - %d %s", self._peer(), status, message)
        self.transport._t.write(raw_reply(status, phrase, type_, message, headers))
        if self.transport._t.can_write_eof():
            self.linger()
        else:
            self.transport._t.close()

    def linger(self) -> None:
        """Half-close after the reply and throw away what the client still sends, for LINGER_S at most."""
        if self.lingering:
            return
        self.lingering = True
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        t = self.transport._t
        t.write_eof()
        try:
            t.resume_reading()
        except RuntimeError:
            pass
        self._linger_timer = self.loop.call_later(LINGER_S, t.close)

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "unix"
