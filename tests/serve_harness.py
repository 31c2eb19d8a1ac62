"""Helpers for the daemon tests: the real `edgeocr serve` in a subprocess, a stand-in for systemd's
notify socket, raw-socket clients and request bodies.  Everything talks to loopback or Unix sockets."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from PIL import Image

from conftest import make_image
from edgeocr.serve import client_request

KEY = "s3cret-key"
STARTED: list["Daemon"] = []      # every daemon a test started, so a failing test leaves none running


def stop_leftovers() -> None:
    while STARTED:
        STARTED.pop().stop()


class NotifyListener:
    """A DGRAM socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, str]] = []
        self.stop = False
        self.on_message = None              # callback(msg) run on the listener thread
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not self.stop:
            try:
                msg = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), msg))
            if self.on_message is not None:
                self.on_message(msg)

    def seen(self, text: str) -> float | None:
        return next((t for t, m in self.messages if m == text or m.startswith(text)), None)

    def wait_for(self, text: str, timeout: float = 60.0) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            t = self.seen(text)
            if t is not None:
                return t
            time.sleep(0.005)
        raise AssertionError(f"no {text!r} notification; got {[m for _, m in self.messages]}")


class Daemon:
    """`edgeocr serve` on a Unix socket and loopback TCP (with an API key), metrics on, 1 ORT thread."""

    def __init__(self, art, tmp: Path, *extra: str, env: dict | None = None, tcp: str | None = None,
                 notify_hook=None, sock: Path | None = None):
        self.sock = sock or tmp / "d.sock"
        self.tmp = tmp
        keyfile = tmp / "key"
        keyfile.write_text(KEY + "\n")
        self.port = free_port()
        self.notify = NotifyListener(tmp / f"notify-{time.monotonic_ns()}.sock")
        self.notify.on_message = notify_hook
        e = dict(os.environ, NOTIFY_SOCKET=self.notify.path, WATCHDOG_USEC="1000000", PYTHONUNBUFFERED="1")
        e.update(env or {})
        self.logpath = tmp / f"daemon-{time.monotonic_ns()}.log"
        self.log = open(self.logpath, "w")
        # EDGEOCR_TEST_DAEMON_PYTHON: run the daemon under another interpreter (e.g. the oldest supported
        # Python with the oldest supported uvicorn), the tests themselves staying here
        python = os.environ.get("EDGEOCR_TEST_DAEMON_PYTHON") or sys.executable
        self.argv = [python, "-m", "edgeocr", "serve", str(art), "--socket", str(self.sock),
                     "--tcp", tcp or f"127.0.0.1:{self.port}", "--api-key-file", str(keyfile), "--metrics", "true",
                     "--threads", "1", *extra]
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=e)
        STARTED.append(self)
        self.unix = f"unix:{self.sock}"
        self.tcp = f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout=90.0) -> list[int]:
        """Poll readiness from the moment the socket answers; returns the statuses seen."""
        seen, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited: {self.logtext()}")
            try:
                code, _ = client_request(self.unix, "GET", "/health/ready", timeout=5)
                seen.append(code)
                if code == 200:
                    return seen
            except OSError:
                pass
            time.sleep(0.01)
        raise AssertionError(f"not ready: {self.logtext()}")

    def logtext(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.logpath.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mib(self) -> float:
        """VmRSS of the daemon process, MiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def stop(self):
        if self in STARTED:
            STARTED.remove(self)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.notify.stop = True
        if not self.log.closed:
            self.log.close()

    def metric(self, name: str) -> float:
        """The value of one metric line (name with labels, as printed) from /metrics."""
        code, raw = client_request(self.unix, "GET", "/metrics")
        assert code == 200
        for line in raw.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{name} not in /metrics")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png(seed=0, size=(300, 400)) -> bytes:
    b = io.BytesIO()
    Image.fromarray(make_image(seed, size)).save(b, "PNG")
    return b.getvalue()


def b64png(seed=0, size=(300, 400)) -> str:
    return base64.b64encode(png(seed, size)).decode()


def multipart(fields: dict, image: bytes, name="image") -> tuple[bytes, str]:
    boundary = "----edgeocrtest"
    out = b""
    for k, v in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
    out += (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="x.png"\r\n'
            f"Content-Type: image/png\r\n\r\n").encode() + image + b"\r\n" + f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def auth(extra=None) -> dict:
    h = {"Authorization": f"Bearer {KEY}", "Host": "127.0.0.1"}
    h.update(extra or {})
    return h


def post_json(addr, path, obj, headers=None, timeout=120.0):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return client_request(addr, "POST", path, json.dumps(obj).encode(), h, timeout=timeout)


def pixel_bomb(w=30000, h=30000) -> bytes:
    """A tiny PNG whose header claims w x h pixels."""
    b = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(b, "PNG")
    data = bytearray(b.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4:ihdr + 12] = struct.pack(">II", w, h)
    data[ihdr + 17:ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr:ihdr + 17])))
    return bytes(data)


def big_flat_png(w=6000, h=6000) -> bytes:
    """A real w x h PNG (one colour: a small file that decodes to w*h*3 bytes)."""
    b = io.BytesIO()
    Image.new("L", (w, h), 255).save(b, "PNG", optimize=False)
    return b.getvalue()


def raw(sock_path: str | None, data: bytes, port: int | None = None, timeout=10.0, shut=False) -> bytes:
    """Send raw bytes on a new connection and read until the server closes (or `timeout`)."""
    s = socket.socket(socket.AF_UNIX) if sock_path else socket.socket()
    s.settimeout(timeout)
    try:
        s.connect(sock_path or ("127.0.0.1", port))
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def parse_reply(resp: bytes) -> tuple[int, dict, bytes]:
    """(status, lower-cased headers, body) of one HTTP/1.1 reply with Content-Length."""
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = body[:int(headers["content-length"])]
    return status, headers, body


def error_of(body: bytes) -> dict:
    """The {"code", "type", "message"} of an error reply, checking the shape."""
    e = json.loads(body)["error"]
    assert set(e) == {"code", "type", "message"} and isinstance(e["code"], int) and e["message"], e
    return e


def dechunk(body: bytes) -> bytes:
    """The payload of a chunked transfer-encoded body."""
    out, pos = b"", 0
    while True:
        eol = body.index(b"\r\n", pos)
        n = int(body[pos:eol].split(b";")[0], 16)
        if n == 0:
            return out
        out += body[eol + 2:eol + 2 + n]
        pos = eol + 2 + n + 2
