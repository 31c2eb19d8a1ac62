"""The real daemon, started as a subprocess on a tiny artifact (Unix socket and loopback TCP)."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from conftest import make_image
from edgeocr.serve import client_request

KEY = "s3cret-key"


class NotifyListener:
    """A DGRAM socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self.stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not self.stop:
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except socket.timeout:
                continue
            except OSError:
                return

    def seen(self, text: str) -> float | None:
        return next((t for t, m in self.messages if m == text or m.startswith(text)), None)


class Daemon:
    def __init__(self, art, tmp: Path, *extra: str, env: dict | None = None):
        self.sock = tmp / "d.sock"
        self.tmp = tmp
        keyfile = tmp / "key"
        keyfile.write_text(KEY + "\n")
        self.port = _free_port()
        self.notify = NotifyListener(tmp / "notify.sock")
        e = dict(os.environ, NOTIFY_SOCKET=self.notify.path, WATCHDOG_USEC="1000000", PYTHONUNBUFFERED="1")
        e.update(env or {})
        self.log = open(tmp / "daemon.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeocr", "serve", str(art), "--socket", str(self.sock),
             "--tcp", f"127.0.0.1:{self.port}", "--api-key-file", str(keyfile), "--metrics", "true", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=e)
        self.unix = f"unix:{self.sock}"
        self.tcp = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout=60.0) -> list[int]:
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
        self.log.flush()
        return (self.tmp / "daemon.log").read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.notify.stop = True
        self.log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _png(seed=0, size=(300, 400)) -> bytes:
    b = io.BytesIO()
    Image.fromarray(make_image(seed, size)).save(b, "PNG")
    return b.getvalue()


def _multipart(fields: dict, image: bytes, name="image") -> tuple[bytes, str]:
    boundary = "----edgeocrtest"
    out = b""
    for k, v in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
    out += (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="x.png"\r\n'
            f"Content-Type: image/png\r\n\r\n").encode() + image + b"\r\n" + f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def _auth(extra=None):
    h = {"Authorization": f"Bearer {KEY}", "Host": "127.0.0.1"}
    h.update(extra or {})
    return h


def post_json(addr, path, obj, headers=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    code, body = client_request(addr, "POST", path, json.dumps(obj).encode(), h)
    return code, body


@pytest.fixture(scope="module")
def daemon(art_a, tmp_path_factory):
    d = Daemon(art_a, tmp_path_factory.mktemp("daemon"))
    statuses = d.wait_ready()
    d.ready_statuses = statuses
    yield d
    d.stop()


def test_readiness_and_notify(daemon):
    assert 503 in daemon.ready_statuses, "ready must answer 503 while warming up"
    assert daemon.ready_statuses[-1] == 200
    n = daemon.notify
    t_status, t_ready = n.seen("STATUS=loading"), n.seen("READY=1")
    assert t_status is not None and t_ready is not None and t_status < t_ready
    assert n.seen("STATUS=warming up") < t_ready
    time.sleep(1.2)
    assert sum(m == "WATCHDOG=1" for _, m in n.messages) >= 2       # pings from the worker loop
    code, body = client_request(daemon.unix, "GET", "/health/live")
    assert code == 200 and json.loads(body)["status"] == "live"
    code, body = client_request(daemon.unix, "GET", "/v1/info")
    info = json.loads(body)
    assert code == 200 and info["backend"] == "onnxruntime-cpu" and len(info["manifest_sha256"]) == 64
    assert oct(os.stat(daemon.sock).st_mode & 0o777) == "0o660"


def test_ocr_multipart_and_json_on_both_transports(daemon):
    img = _png(1)
    body, ctype = _multipart({"task": "spotting", "max_new_tokens": "4"}, img)
    for addr, h in ((daemon.unix, {}), (daemon.tcp, _auth())):
        code, raw = client_request(addr, "POST", "/v1/ocr", body, dict(h, **{"Content-Type": ctype}))
        r = json.loads(raw)
        assert code == 200, raw
        assert r["generated_tokens"] == 4 and r["task"] == "spotting" and r["finish_reason"] == "length"
        assert {"vision", "prefill", "decode", "total"} <= set(r["timings_ms"]) and r["image_size"] == [400, 300]
        code, raw = post_json(addr, "/v1/ocr", {"image": base64.b64encode(img).decode(), "prompt": "Read it.",
                                                "max_new_tokens": 3}, h)
        assert code == 200 and json.loads(raw)["generated_tokens"] == 3
        uri = "data:image/png;base64," + base64.b64encode(img).decode()
        code, raw = post_json(addr, "/v1/ocr", {"image": uri, "task": "structured_parse", "max_new_tokens": 2}, h)
        assert code == 200


def test_streaming_ndjson_and_openai(daemon):
    img = base64.b64encode(_png(2)).decode()
    code, raw = post_json(daemon.unix, "/v1/ocr", {"image": img, "max_new_tokens": 5, "stream": True})
    lines = [json.loads(x) for x in raw.decode().splitlines()]
    assert code == 200 and len(lines) == 6 and all("token" in x for x in lines[:5])
    assert lines[-1]["done"] and lines[-1]["generated_tokens"] == 5
    assert "".join(x["text"] for x in lines[:5]) == lines[-1]["text"]
    req = {"model": "hunyuanocr", "max_tokens": 4, "messages": [
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}},
                                     {"type": "text", "text": "检测并识别图片中的文字，将文本坐标格式化输出。"}]}]}
    code, raw = post_json(daemon.tcp, "/v1/chat/completions", req, _auth())
    r = json.loads(raw)
    assert code == 200 and r["object"] == "chat.completion" and r["usage"]["completion_tokens"] == 4
    assert r["choices"][0]["finish_reason"] == "length" and isinstance(r["choices"][0]["message"]["content"], str)
    code, raw = post_json(daemon.unix, "/v1/chat/completions", dict(req, stream=True))
    events = [x[6:] for x in raw.decode().split("\n\n") if x.startswith("data: ")]
    assert code == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[-1]["choices"][0]["finish_reason"] == "length"


def _pixel_bomb() -> bytes:
    """A tiny PNG whose header claims 30000 x 30000 pixels."""
    b = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(b, "PNG")
    png = bytearray(b.getvalue())
    ihdr = png.index(b"IHDR")
    png[ihdr + 4:ihdr + 12] = struct.pack(">II", 30000, 30000)
    crc = zlib.crc32(bytes(png[ihdr:ihdr + 17]))
    png[ihdr + 17:ihdr + 21] = struct.pack(">I", crc)
    return bytes(png)


def test_malformed_inputs_get_the_right_status_and_daemon_keeps_serving(daemon):
    good = _png(3)
    b64 = base64.b64encode(good).decode()
    cases = [
        ({"image": base64.b64encode(good[: len(good) // 2]).decode()}, 400, "invalid_image"),
        ({"image": base64.b64encode(b"not an image at all").decode()}, 400, "invalid_image"),
        ({"image": base64.b64encode(_pixel_bomb()).decode()}, 413, "invalid_image"),
        ({"image": "!!!notbase64"}, 400, "invalid_request"),
        ({"image": "https://example.com/x.png"}, 400, "invalid_request"),
        ({"image": b64, "max_new_tokens": -1}, 400, "invalid_request"),
        ({"image": b64, "max_new_tokens": 10 ** 6}, 400, "invalid_request"),
        ({"image": b64, "task": "poetry"}, 400, "invalid_request"),
        ({"image": b64, "colour": "red"}, 400, "invalid_request"),
        ({}, 400, "invalid_request"),
    ]
    for obj, status, typ in cases:
        code, raw = post_json(daemon.unix, "/v1/ocr", obj)
        err = json.loads(raw)["error"]
        assert (code, err["type"], err["code"]) == (status, typ, status), (obj.keys(), raw)
        assert err["message"]
    code, raw = client_request(daemon.unix, "POST", "/v1/ocr", b"{broken", {"Content-Type": "application/json"})
    assert code == 400 and json.loads(raw)["error"]["type"] == "invalid_json"
    # oversize body: refused from the Content-Length header, before the body is read
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(daemon.sock))
        s.sendall(b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 22020096\r\n\r\n" + b"x" * 1000)
        resp = b""
        while chunk := s.recv(65536):
            resp += chunk
    head, _, body = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 413") and json.loads(body)["error"]["type"] == "payload_too_large"
    code, raw = client_request(daemon.unix, "POST", "/v1/ocr", b"abc", {"Content-Type": "text/plain"})
    assert code == 415
    body, ctype = _multipart({"task": "spotting"}, good, name="file")
    code, raw = client_request(daemon.unix, "POST", "/v1/ocr", body, {"Content-Type": ctype})
    assert code == 400 and "'image'" in json.loads(raw)["error"]["message"]
    # TCP guards
    code, raw = post_json(daemon.tcp, "/v1/ocr", {"image": b64}, {"Authorization": "Bearer wrong", "Host": "127.0.0.1"})
    assert code == 401 and json.loads(raw)["error"]["type"] == "unauthorized"
    code, raw = post_json(daemon.tcp, "/v1/ocr", {"image": b64}, {"Host": "127.0.0.1"})
    assert code == 401
    code, raw = post_json(daemon.tcp, "/v1/ocr", {"image": b64}, _auth({"Host": "evil.example.com"}))
    assert code == 403 and json.loads(raw)["error"]["type"] == "forbidden_host"
    code, _ = client_request(daemon.unix, "GET", "/nope")
    assert code == 404
    # still serving
    code, raw = post_json(daemon.unix, "/v1/ocr", {"image": b64, "max_new_tokens": 2})
    assert code == 200 and json.loads(raw)["generated_tokens"] == 2
    code, raw = client_request(daemon.unix, "GET", "/metrics")
    text = raw.decode()
    assert 'edgeocr_requests_total{endpoint="/v1/ocr",status="400"}' in text
    assert "edgeocr_request_seconds_bucket" in text and "edgeocr_queue_depth" in text
    log = daemon.logtext()
    assert b64[:40] not in log and "POST /v1/ocr 413" in log


def test_burst_beyond_queue_gets_503_and_accepted_complete(art_a, tmp_path):
    d = Daemon(art_a, tmp_path, "--queue-size", "2", "--metrics", "false")
    try:
        d.wait_ready()
        b64 = base64.b64encode(_png(4)).decode()

        def one(_):
            return post_json(d.unix, "/v1/ocr", {"image": b64, "max_new_tokens": 300, "prompt": "x"})

        with ThreadPoolExecutor(10) as ex:
            results = list(ex.map(one, range(10)))
        codes = [c for c, _ in results]
        assert codes.count(503) >= 1 and codes.count(200) >= 3, codes
        assert set(codes) <= {200, 503}
        for c, raw in results:
            r = json.loads(raw)
            if c == 503:
                assert r["error"]["type"] == "overloaded"
            else:
                assert r["finish_reason"] in ("length", "stop", "cache_full", "repetition")
    finally:
        d.stop()


def test_retry_after_header(art_a, tmp_path):
    import http.client
    d = Daemon(art_a, tmp_path, "--queue-size", "1")
    try:
        d.wait_ready()
        b64 = base64.b64encode(_png(5)).decode()
        body = json.dumps({"image": b64, "max_new_tokens": 400, "prompt": "x"}).encode()
        with ThreadPoolExecutor(8) as ex:
            futs = []
            for _ in range(5):
                # one request running and one waiting fill a queue of 1: then TCP must get 503
                futs += [ex.submit(post_json, d.unix, "/v1/ocr", json.loads(body)) for _ in range(2)]
                depth, end = 0, time.monotonic() + 10
                while depth < 1 and time.monotonic() < end:
                    depth = json.loads(client_request(d.unix, "GET", "/health/ready")[1]).get("queue_depth", 0)
                conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
                conn.request("POST", "/v1/ocr", body, _auth({"Content-Type": "application/json"}))
                resp = conn.getresponse()
                resp.read()
                if resp.status == 503:
                    break
            assert resp.status == 503 and int(resp.getheader("Retry-After")) >= 1
            assert all(f.result()[0] in (200, 503) for f in futs)
    finally:
        d.stop()


def test_sigterm_drains_in_flight_request(art_a, tmp_path):
    d = Daemon(art_a, tmp_path)
    d.wait_ready()
    b64 = base64.b64encode(_png(6)).decode()
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post_json, d.unix, "/v1/ocr", {"image": b64, "max_new_tokens": 400, "prompt": "x"})
        time.sleep(0.4)                        # the request is running
        d.proc.send_signal(signal.SIGTERM)
        code, raw = fut.result(timeout=60)
    assert code == 200 and json.loads(raw)["generated_tokens"] > 0
    assert d.proc.wait(30) == 0
    assert d.notify.seen("STOPPING=1") is not None
    assert not d.sock.exists()
    d.stop()


def test_second_signal_exits_at_once(art_a, tmp_path):
    d = Daemon(art_a, tmp_path, "--drain-s", "60")
    d.wait_ready()
    b64 = base64.b64encode(_png(7)).decode()
    with ThreadPoolExecutor(6) as ex:
        for _ in range(6):      # seconds of accepted work, so the drain is still going
            ex.submit(post_json, d.unix, "/v1/ocr", {"image": b64, "max_new_tokens": 400, "prompt": "x"})
        time.sleep(0.4)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(10) == 130 and time.monotonic() - t0 < 5
    d.stop()


def test_settings_precedence_flags_env_file(tmp_path):
    import argparse

    from edgeocr.serve_config import ConfigError, add_arguments, resolve
    conf = tmp_path / "edgeocr.conf"
    conf.write_text("# comment\nartifact = /from/file\nqueue_size = 3\ndevice = cuda\nmetrics = true\n")
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    cfg = resolve(ap.parse_args(["--config", str(conf), "--queue-size", "5"]), {"EDGEOCR_DEVICE": "cpu"})
    assert (cfg.artifact, cfg.queue_size, cfg.device, cfg.metrics) == ("/from/file", 5, "cpu", True)
    conf.write_text("bogus = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        resolve(ap.parse_args(["--config", str(conf)]), {})
    with pytest.raises(ConfigError, match="bad value"):
        resolve(ap.parse_args(["x", "--queue-size", "many"]), {})
    with pytest.raises(ConfigError, match="no artifact"):
        resolve(ap.parse_args([]), {})
    out = subprocess.run([sys.executable, "-m", "edgeocr", "serve", "--help"], capture_output=True, text=True).stdout
    for name in ("EDGEOCR_QUEUE_SIZE", "EDGEOCR_API_KEY_FILE", "EDGEOCR_MAX_PIXELS", "--deadline-s", "--config"):
        assert name in out


def test_remote_run_and_doctor(daemon, tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(_png(8))
    r = subprocess.run([sys.executable, "-m", "edgeocr", "run", str(p), "--remote", daemon.unix, "--max-new-tokens", "3",
                        "--format", "json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated_tokens"] == 3 and "(remote)" in r.stderr
    r = subprocess.run([sys.executable, "-m", "edgeocr", "doctor", "--remote", daemon.unix], capture_output=True,
                       text=True, timeout=120)
    assert "onnxruntime" in r.stdout and "HTTP 200 (ready)" in r.stdout


def test_page_works_in_headless_chromium(art_a, tmp_path):
    assert shutil.which("chromium"), "needs Debian's chromium: scripts/setup.sh installs it (as root)"
    d = Daemon(art_a, tmp_path, "--api-key-file", "")
    try:
        d.wait_ready()
        profile = tmp_path / "chrome"
        cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--run-all-compositor-stages-before-draw",
               "--dump-dom", f"http://127.0.0.1:{d.port}/?demo=1"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
        assert 'data-state="done"' in out, out[-2000:]
        assert 'data-tokens="' in out and "tokens," in out
        code, raw = client_request(d.tcp, "GET", "/", headers={"Host": "localhost"})
        assert code == 200 and b"<canvas" in raw
    finally:
        d.stop()
