"""Soak: SOAK_REQUESTS mixed valid and invalid requests from CLIENTS concurrent clients (Unix socket and
loopback TCP) against the real daemon.  Nothing accepted may be lost: every 200 carries a complete body
(whole JSON, a full NDJSON stream ending in done, an SSE stream ending in [DONE]) and the daemon's own
count of 200s equals the clients'; every refusal is a 4xx or a 503 with Retry-After, in the error shape."""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgeocr.serve.client import _connection
from serve_harness import STARTED, Daemon, auth, b64png, error_of, multipart, pixel_bomb, png

SOAK_REQUESTS = 520
CLIENTS = 16
BUDGET_S = 150.0               # the soak's wall-clock bound

KINDS = ["json", "multipart", "ndjson", "chat", "sse", "bad_base64", "bad_json", "unknown_field", "pixel_bomb",
         "wrong_type", "too_large", "leave", "no_route", "no_key"]
VALID = {"json", "multipart", "ndjson", "chat", "sse"}


@pytest.fixture(autouse=True)
def _no_daemon_left_behind():
    """Module-scoped daemons stay; any daemon a test started itself is stopped even when the test fails."""
    before = list(STARTED)
    yield
    for d in [d for d in STARTED if d not in before]:
        d.stop()


def _request(d: Daemon, kind: str, i: int, img: str, raw_png: bytes):
    """(transport, method, path, body, headers, expected statuses, tokens asked)."""
    n = 2 + i % 7
    tcp = i % 3 == 0
    jh = {"Content-Type": "application/json"}
    uri = "data:image/png;base64," + img
    chat = {"model": "hunyuanocr", "max_tokens": n, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "Read."}]}]}
    table = {
        "json": ("/v1/ocr", json.dumps({"image": img, "max_new_tokens": n}).encode(), jh, {200}),
        "ndjson": ("/v1/ocr", json.dumps({"image": img, "max_new_tokens": n, "stream": True}).encode(), jh, {200}),
        "chat": ("/v1/chat/completions", json.dumps(chat).encode(), jh, {200}),
        "sse": ("/v1/chat/completions", json.dumps(dict(chat, stream=True)).encode(), jh, {200}),
        "bad_base64": ("/v1/ocr", b'{"image": "%%%"}', jh, {400}),
        "bad_json": ("/v1/ocr", b'{"image": ' + b"[" * 5000, jh, {400}),
        "unknown_field": ("/v1/ocr", json.dumps({"image": img, "colour": 1}).encode(), jh, {400}),
        "pixel_bomb": ("/v1/ocr", json.dumps({"image": __import__("base64").b64encode(pixel_bomb()).decode()}).encode(),
                       jh, {413}),
        "wrong_type": ("/v1/ocr", json.dumps({"image": img, "max_new_tokens": str(n)}).encode(), jh, {400}),
        "too_large": ("/v1/ocr", b"x" * (4 * 1024 * 1024 + 1), jh, {413}),
        "no_route": ("/v1/nothing", b"{}", jh, {404}),
        "no_key": ("/v1/ocr", json.dumps({"image": img}).encode(), jh, {401}),
    }
    if kind == "multipart":
        body, ctype = multipart({"max_new_tokens": str(n)}, raw_png)
        return tcp, "/v1/ocr", body, {"Content-Type": ctype}, {200}, n
    if kind == "no_key":
        tcp = True
    path, body, headers, expect = table[kind]
    return tcp, path, body, headers, expect, n


def _check_200(kind: str, body: bytes, n: int) -> None:
    if kind in ("json", "multipart"):
        r = json.loads(body)
        assert r["finish_reason"] in ("length", "stop") and 1 <= r["generated_tokens"] <= n and "text" in r
    elif kind == "chat":
        r = json.loads(body)
        assert r["choices"][0]["message"]["content"] is not None and r["usage"]["completion_tokens"] <= n
    elif kind == "ndjson":
        lines = [json.loads(x) for x in body.decode().splitlines()]
        assert lines[-1]["done"] and lines[-1]["generated_tokens"] == len(lines) - 1
        assert "".join(x["text"] for x in lines[:-1]) == lines[-1]["text"]
    elif kind == "sse":
        events = [x[6:] for x in body.decode().split("\n\n") if x.startswith("data: ")]
        assert events[-1] == "[DONE]"
        finals = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finals[-1] in ("length", "stop") and all(f is None for f in finals[:-1])


def test_soak_mixed_clients_lose_nothing(art_a, tmp_path):
    d = Daemon(art_a, tmp_path, "--queue-size", "4", "--max-body-bytes", str(4 * 1024 * 1024), "--deadline-s", "60")
    try:
        d.wait_ready()
        img, raw_png = b64png(31), png(31)
        rng = random.Random(7)
        plan = [rng.choice(KINDS) for _ in range(SOAK_REQUESTS)]
        t_end = time.monotonic() + BUDGET_S

        def run(i: int):
            kind = plan[i]
            if time.monotonic() > t_end:
                return kind, "skipped", None, b""
            if kind == "leave":                       # send a long request and hang up at once
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(d.sock))
                b = json.dumps({"image": img, "prompt": "x", "max_new_tokens": 400}).encode()
                s.sendall(b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                          + str(len(b)).encode() + b"\r\n\r\n" + b)
                s.close()
                return kind, "left", None, b""
            tcp, path, body, headers, expect, n = _request(d, kind, i, img, raw_png)
            h = dict(headers)
            if tcp:
                h.update(auth() if kind != "no_key" else {"Host": "127.0.0.1"})
                conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=90)
            else:
                conn = _connection(d.unix, 90)
            try:
                conn.request("POST", path, body, h)
                resp = conn.getresponse()
                data = resp.read()
                status, retry = resp.status, resp.getheader("Retry-After")
            except (BrokenPipeError, ConnectionResetError) as e:
                return kind, "reset", str(e), b""
            finally:
                conn.close()
            if status == 200:
                assert kind in VALID, (kind, data[:200])
                _check_200(kind, data, n)
            elif status == 503:
                assert int(retry) >= 1 and error_of(data)["type"] in ("overloaded",), data
                time.sleep(0.5)                            # back off a little, as a client would
            else:
                assert status in expect, (kind, status, data[:300])
                error_of(data)
            return kind, status, retry, data

        t0 = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as ex:
            results = list(ex.map(run, range(SOAK_REQUESTS)))
        took = time.monotonic() - t0
        outcome = Counter((k, s) for k, s, _, _ in results)
        statuses = Counter(s for _, s, _, _ in results)
        print(f"soak: {SOAK_REQUESTS} requests, {CLIENTS} clients, {took:.1f} s; {dict(statuses)}")
        assert statuses["skipped"] == 0, f"the soak ran past its {BUDGET_S} s budget: {dict(statuses)}"
        assert statuses["reset"] == 0, outcome
        served = sum(1 for k, s, _, _ in results if s == 200)
        assert served >= 15 and statuses[503] >= 1, dict(statuses)
        # the daemon's own count of 200s equals the clients' complete 200s: nothing accepted was lost
        ocr_200 = sum(1 for k, s, _, _ in results if s == 200 and k in ("json", "multipart", "ndjson"))
        chat_200 = served - ocr_200
        end = time.monotonic() + 30
        while json.loads(_connection_get(d, "/health/ready")).get("in_engine") and time.monotonic() < end:
            time.sleep(0.05)
        assert d.metric('edgeocr_requests_total{endpoint="/v1/ocr",status="200"}') == ocr_200
        assert d.metric('edgeocr_requests_total{endpoint="/v1/chat/completions",status="200"}') == chat_200
        assert d.alive()
        log = d.logtext()
        assert "Traceback" not in log and " 500 " not in log
    finally:
        d.stop()


def _connection_get(d: Daemon, path: str) -> bytes:
    conn = _connection(d.unix, 10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()
