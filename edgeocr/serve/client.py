"""A minimal stdlib client for `unix:/path/to.sock` or `http://host:port` daemons (CLI --remote, doctor)."""

from __future__ import annotations

import http.client
import socket
from urllib.parse import urlparse


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
    u = urlparse(address)
    if u.scheme != "http" or not u.hostname:
        raise OSError(f"daemon address {address!r}: use unix:/path.sock or http://HOST:PORT")
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
