"""A hostile local client against the real daemon (subprocess; Unix socket and loopback TCP only).

Each attack is bounded in count and time, and is followed by the same checks: the daemon is alive,
its RSS is within RSS_GROWTH_MIB of what it was after one served request (ONNX Runtime's arena holds
the prefill's working set: ~1.5 GiB on this artifact), and a valid request is served within PROMPT_S.
The artifact has a long KV cache (8192) so that one request can keep the engine busy for seconds.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgeocr.serve import client_request
from serve_harness import (STARTED, Daemon, auth, b64png, big_flat_png, dechunk, error_of, free_port, parse_reply,
                           pixel_bomb, post_json, raw)

RSS_GROWTH_MIB = 256          # RSS after any attack stays within this of the RSS after one served request
PROMPT_S = 10.0               # a valid two-token request right after an attack is answered within this
MAX_BODY = 2 * 1024 * 1024
LONG = {"prompt": "x", "max_new_tokens": 6000}      # seconds of decoding on the long-cache artifact
HOSTILE_FLAGS = ("--queue-size", "2", "--max-body-bytes", str(MAX_BODY), "--header-timeout-s", "1",
                 "--body-timeout-s", "1.5", "--send-timeout-s", "1.5", "--keep-alive-s", "2",
                 "--max-connections", "48", "--max-new-tokens", "6000", "--deadline-s", "60", "--drain-s", "5")


@pytest.fixture(autouse=True)
def _no_daemon_left_behind():
    """Module-scoped daemons stay; any daemon a test started itself is stopped even when the test fails."""
    before = list(STARTED)
    yield
    for d in [d for d in STARTED if d not in before]:
        d.stop()


@pytest.fixture(scope="module")
def art_long(ckpt_a, tmp_path_factory):
    from quantize.export import ExportOptions, export
    out = tmp_path_factory.mktemp("art-long") / "tiny-a-8k"
    export(ckpt_a, out, ExportOptions(cache_len=8192, prefill_len=1400))
    return out


@pytest.fixture(scope="module")
def hostile(art_long, tmp_path_factory):
    d = Daemon(art_long, tmp_path_factory.mktemp("hostile"), *HOSTILE_FLAGS)
    d.wait_ready()
    code, _ = post_json(d.unix, "/v1/ocr", {"image": b64png(0), "max_new_tokens": 2})
    assert code == 200
    d.baseline_rss = d.rss_mib()
    yield d
    d.stop()
    log = d.logtext()
    assert "Traceback" not in log and "terminate called" not in log, log[-3000:]


def still_serving(d: Daemon) -> None:
    assert d.alive(), d.logtext()[-2000:]
    rss = d.rss_mib()
    assert rss - d.baseline_rss < RSS_GROWTH_MIB, f"RSS {rss:.0f} MiB, {d.baseline_rss:.0f} MiB after one request"
    wait_idle(d)
    t0 = time.monotonic()
    code, body = post_json(d.unix, "/v1/ocr", {"image": b64png(1), "max_new_tokens": 2}, timeout=PROMPT_S)
    assert code == 200 and json.loads(body)["generated_tokens"] == 2, body
    assert time.monotonic() - t0 < PROMPT_S


def ready(d: Daemon) -> dict:
    return json.loads(client_request(d.unix, "GET", "/health/ready", timeout=5)[1])


def wait_idle(d: Daemon, timeout=20.0) -> float:
    """Seconds until no page is in the engine and nothing is queued."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = ready(d)
        if r.get("in_engine") == 0 and r.get("queue_depth") == 0:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"engine still busy after {timeout} s: {ready(d)}")


def wait_busy(d: Daemon, timeout=20.0) -> None:
    """Until a page is decoding in the slot (past image decoding, vision and prefill)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready(d).get("slots_busy") == 1:
            return
        time.sleep(0.01)
    raise AssertionError("the long request never reached the engine")


def open_request(d: Daemon, obj: dict, path="/v1/ocr") -> socket.socket:
    """Send a complete request on a Unix connection and leave the connection open."""
    body = json.dumps(obj).encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(str(d.sock))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def test_body_cap_cannot_be_lifted_by_any_header(hostile):
    d = hostile
    big = b"x" * (3 * MAX_BODY // 2)
    # negative Content-Length with a body over the cap: refused, never read to the end or served
    for port in (None, d.port):
        resp = raw(None if port else str(d.sock), b"POST /v1/ocr HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n" + big, port=port)
        status, headers, body = parse_reply(resp)
        assert status == 400 and error_of(body)["type"] == "bad_http" and headers["connection"] == "close"
    for cl in (b"abc", b"1e9", b"5, 6"):
        status, _, body = parse_reply(raw(str(d.sock), b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                          + cl + b"\r\n\r\n{}"))
        assert status == 400 and error_of(body)["type"] == "bad_http", cl
    # a declared length over the cap: 413 from the header, at once
    t0 = time.monotonic()
    status, headers, body = parse_reply(raw(str(d.sock), b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                            + str(MAX_BODY + 1).encode() + b"\r\n\r\n" + b"x" * 100))
    assert status == 413 and error_of(body)["type"] == "payload_too_large" and time.monotonic() - t0 < 2
    # chunked, no length at all: counted as it arrives
    chunks = b"".join(b"%x\r\n" % len(c) + c + b"\r\n" for c in [b"y" * 65536] * 40) + b"0\r\n\r\n"
    status, _, body = parse_reply(raw(str(d.sock), b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                      b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks))
    assert status == 413 and error_of(body)["type"] == "payload_too_large"
    # under the cap, chunked: accepted and parsed like any body
    body_ok = json.dumps({"image": b64png(2), "max_new_tokens": 2}).encode()
    chunked = b"".join(b"%x\r\n" % len(body_ok[i:i + 999]) + body_ok[i:i + 999] + b"\r\n"
                       for i in range(0, len(body_ok), 999)) + b"0\r\n\r\n"
    status, _, body = parse_reply(raw(str(d.sock), b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                      b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked))
    assert status == 200 and json.loads(body)["generated_tokens"] == 2
    still_serving(d)


def test_slow_and_silent_clients_are_timed_out(hostile):
    d = hostile
    t0 = time.monotonic()                     # slowloris: headers never finish
    status, headers, body = parse_reply(raw(str(d.sock), b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n"))
    assert status == 408 and error_of(body)["type"] == "request_timeout" and 0.8 < time.monotonic() - t0 < 4
    t0 = time.monotonic()                     # fewer body bytes than Content-Length, then silence
    status, headers, body = parse_reply(raw(str(d.sock), b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                            b"application/json\r\nContent-Length: 1000\r\n\r\n{\"image\": "))
    assert status == 408 and error_of(body)["type"] == "request_timeout" and 1.3 < time.monotonic() - t0 < 5
    assert ready(d)["queue_depth"] == 0       # its queue place was given back
    t0 = time.monotonic()                     # a connection that never says anything is closed
    assert raw(str(d.sock), b"") == b"" and time.monotonic() - t0 < 4
    # many half-sent requests at once: no thread per connection, all closed by the deadlines
    threads0 = _threads(d.pid)
    socks = []
    for i in range(150):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(d.sock))
        s.sendall(b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{" if i % 2 else b"GET / HTT")
        socks.append(s)
    time.sleep(0.3)
    assert _threads(d.pid) <= threads0 + 2
    statuses = []
    for s in socks:
        s.settimeout(8)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        statuses.append(parse_reply(data)[0])
        s.close()
    assert set(statuses) <= {408, 503} and statuses.count(503) >= 100, statuses     # 48 connections at most
    # a client that stops reading its replies is dropped after send_timeout_s
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(str(d.sock))
    s.settimeout(10)
    s.sendall(b"GET /sample.png HTTP/1.1\r\nHost: x\r\n\r\n" * 400)
    time.sleep(3.5)
    got, end = 0, time.monotonic() + 5
    try:
        while time.monotonic() < end and (chunk := s.recv(1 << 20)):
            got += len(chunk)
    except ConnectionResetError:
        pass
    s.close()
    one = len(client_request(d.unix, "GET", "/sample.png")[1])
    assert got < 400 * one and "read nothing for 1.5 s" in d.logtext()
    still_serving(d)


def _threads(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError


def test_burst_of_connections_gets_answers_not_resets(hostile):
    d = hostile
    assert "(backlog " in d.logtext()
    body = {"image": b64png(3), "max_new_tokens": 2}

    def one(i):
        try:
            addr = d.unix if i % 4 else d.tcp
            h = {"Content-Type": "application/json", **(auth() if i % 4 == 0 else {})}
            import http.client
            if addr.startswith("unix:"):
                from edgeocr.serve.client import _connection
                conn = _connection(addr, 60)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
            conn.request("POST", "/v1/ocr", json.dumps(body).encode(), h)
            r = conn.getresponse()
            return r.status, r.getheader("Retry-After"), r.read()
        except OSError as e:
            return "error", str(e), b""

    with ThreadPoolExecutor(60) as ex:
        results = list(ex.map(one, range(60)))
    codes = [c for c, _, _ in results]
    assert set(codes) <= {200, 503} and codes.count(200) >= 3, codes
    for c, retry, b in results:
        if c == 503:
            assert int(retry) >= 1 and error_of(b)["type"] == "overloaded"
        else:
            assert json.loads(b)["generated_tokens"] == 2
    still_serving(d)


def test_disconnects_cancel_their_work_within_a_step(hostile):
    d = hostile
    gone0 = d.metric('edgeocr_cancelled_total{reason="client_gone"}')
    # NDJSON stream: read a few tokens, leave
    s = open_request(d, dict(LONG, image=b64png(4), stream=True))
    f = s.makefile("rb")
    while f.readline().strip():               # headers
        pass
    for _ in range(3):
        f.readline()
    f.close()
    s.close()
    assert wait_idle(d) < 1.5
    # SSE (OpenAI) stream
    uri = "data:image/png;base64," + b64png(4)
    s = open_request(d, {"stream": True, "max_tokens": 6000, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "x"}]}]}, "/v1/chat/completions")
    f = s.makefile("rb")
    assert b"200" in f.readline()
    seen = 0
    while seen < 3:
        line = f.readline()
        assert b"[DONE]" not in line and line
        seen += b'"content"' in line
    f.close()
    s.close()
    assert wait_idle(d) < 1.5
    # a whole-reply request, dropped while it runs
    s = open_request(d, dict(LONG, image=b64png(5)))
    wait_busy(d)
    time.sleep(0.3)
    s.close()
    assert wait_idle(d) < 1.5
    # dropped while queued behind a running one: never started
    a = open_request(d, dict(LONG, image=b64png(6)))
    wait_busy(d)
    b = open_request(d, dict(LONG, image=b64png(7)))
    end = time.monotonic() + 10
    while ready(d)["queue_depth"] != 1 and time.monotonic() < end:
        time.sleep(0.01)
    b.close()
    time.sleep(0.2)
    a.close()
    assert wait_idle(d) < 1.5
    assert "client left before its turn: dropped" in d.logtext()
    assert d.metric('edgeocr_cancelled_total{reason="client_gone"}') - gone0 == 5
    still_serving(d)


def test_image_bombs_are_refused_before_decoding(hostile):
    d = hostile
    flat = base64.b64encode(big_flat_png()).decode()       # 6000x6000: a small file, 108 MB once decoded
    assert len(flat) < MAX_BODY
    keep = [open_request(d, dict(LONG, image=b64png(8)))]
    wait_busy(d)
    keep += [open_request(d, dict(LONG, image=b64png(9))) for _ in range(2)]
    end = time.monotonic() + 10
    while ready(d)["queue_depth"] != 2 and time.monotonic() < end:
        time.sleep(0.01)
    rss0 = d.rss_mib()
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda _: post_json(d.unix, "/v1/ocr", {"image": flat, "max_new_tokens": 2}), range(8)))
    assert all(c == 503 and error_of(b)["type"] == "overloaded" for c, b in results)
    assert d.rss_mib() - rss0 < 64
    for s in keep:
        s.close()
    wait_idle(d)
    rss0 = d.rss_mib()
    code, body = post_json(d.unix, "/v1/ocr", {"image": base64.b64encode(pixel_bomb(9000, 9000)).decode()})
    assert code == 413 and "81,000,000 pixels exceeds the pixel limit of 40,000,000" in error_of(body)["message"]
    code, body = post_json(d.unix, "/v1/ocr", {"image": base64.b64encode(pixel_bomb()).decode()})
    assert code == 413 and "900,000,000 pixels exceeds the pixel limit of 40,000,000 (max_pixels" \
        in error_of(body)["message"]
    code, body = post_json(d.unix, "/v1/ocr", {"image": base64.b64encode(pixel_bomb(60000, 2)).decode()})
    assert code == 400 and "smaller than the minimum page of 16x16" in error_of(body)["message"]
    code, body = post_json(d.unix, "/v1/ocr", {"image": base64.b64encode(pixel_bomb(4000, 16)).decode()})
    assert code == 400 and "aspect ratio" in error_of(body)["message"]      # 250:1, over the 200:1 limit
    assert d.rss_mib() - rss0 < 64
    still_serving(d)


def test_hostile_json_and_http_get_json_errors(hostile):
    d = hostile
    img = b64png(10)
    uri = "data:image/png;base64," + img
    bodies = [
        (b"[" * 50000 + b"]" * 50000, "invalid_json"),
        (b'{"image": "' + img.encode() + b'", "max_new_tokens": ' + b"7" * 5000 + b"}", "invalid_json"),
        (b'{"image": "' + img.encode() + b'", "prompt": "\\ud800"}', "invalid_request"),
        (b'{"image": "' + img.encode() + b'", "max_new_tokens": NaN}', "invalid_request"),
        (json.dumps({"image": img, "task": ["spotting"]}).encode(), "invalid_request"),
        (json.dumps({"image": img, "lang": {"a": 1}}).encode(), "invalid_request"),
        (json.dumps({"image": img, "stream": "true"}).encode(), "invalid_request"),
        (json.dumps({"image": [img]}).encode(), "invalid_request"),
        (json.dumps({"image": img, "prompt": "x " * 3000}).encode(), "invalid_request"),   # longer than the cache
        (b"\xff\xfe\x00{", "invalid_json"),
    ]
    for body, typ in bodies:
        code, raw_body = client_request(d.unix, "POST", "/v1/ocr", body, {"Content-Type": "application/json"})
        assert code == 400 and error_of(raw_body)["type"] == typ, (body[:60], raw_body)
    chats = [{"messages": [{"role": "user", "content": 5}]},
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}]}],
              "max_tokens": [1]},
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                        {"type": "text", "text": "\udc00"}]}]}]
    for c in chats:
        body = json.dumps(c).encode()
        code, raw_body = client_request(d.unix, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        assert code == 400 and error_of(raw_body)["type"] == "invalid_request", raw_body
    for ctype in ("application/jsonx", "application/json-patch+json", "multipart/form-datax; boundary=b"):
        code, raw_body = client_request(d.unix, "POST", "/v1/ocr", json.dumps({"image": img}).encode(),
                                        {"Content-Type": ctype})
        assert code == 415 and error_of(raw_body)["type"] == "unsupported_media_type", (ctype, raw_body)
    for slow in (False, True):              # headers over 16 KiB, in one piece or trickled
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(d.sock))
        head = b"GET /v1/info HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n"
        for i in range(0, len(head), 4096 if slow else len(head)):
            s.sendall(head[i:i + (4096 if slow else len(head))])
        s.settimeout(10)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        status, _, body = parse_reply(data)
        assert status in (400, 431) and error_of(body)["type"] in ("bad_http", "headers_too_large"), slow
    for req in (b"HELLO\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
                b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"):
        status, headers, body = parse_reply(raw(str(d.sock), req))
        assert status == 400 and error_of(body)["type"] == "bad_http", req[:40]
    status, _, body = parse_reply(raw(None, b"GET /v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil\r\n"
                                            b"Authorization: Bearer s3cret-key\r\n\r\n", port=d.port))
    assert status == 400 and error_of(body)["type"] == "bad_http"          # h11 refuses a second Host
    status, _, body = parse_reply(raw(None, b"GET /v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                                            b"wrong\r\nAuthorization: Bearer s3cret-key\r\n\r\n", port=d.port))
    assert status == 400 and "'authorization' given more than once" in error_of(body)["message"]
    status, headers, body = parse_reply(raw(str(d.sock), b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"))
    assert status == 404 and headers["connection"] == "close"
    still_serving(d)


def test_signals_in_every_phase(art_long, tmp_path):
    def stop_in(phase_status: str, name: str):
        holder = {}

        def hook(msg):
            if msg.startswith(phase_status) and "pid" in holder:
                os.kill(holder["pid"], signal.SIGSTOP)        # freeze it inside this phase
                holder["frozen"] = True

        d = Daemon(art_long, tmp_path / name, notify_hook=hook)
        holder["pid"] = d.pid
        end = time.monotonic() + 60
        while "frozen" not in holder and time.monotonic() < end and d.alive():
            time.sleep(0.002)
        assert holder.get("frozen"), d.logtext()
        d.signal(signal.SIGTERM)
        os.kill(d.pid, signal.SIGCONT)
        t0 = time.monotonic()
        assert d.proc.wait(10) == 0 and time.monotonic() - t0 < 5
        return d

    for sub in ("loading", "warming"):
        (tmp_path / sub).mkdir()
    d = stop_in("STATUS=loading", "loading")
    assert "SIGTERM while loading: exiting" in d.logtext() and not d.sock.exists()
    d.notify.wait_for("STOPPING=1", timeout=5)
    assert not d.notify.seen("READY=1")
    d.stop()
    d = stop_in("STATUS=warming up", "warming")
    assert "SIGTERM while warming up: exiting" in d.logtext() and not d.sock.exists()
    d.stop()
    # SIGHUP while serving: drain, the in-flight request completes, exit 0
    (tmp_path / "hup").mkdir()
    d = Daemon(art_long, tmp_path / "hup")
    d.wait_ready()
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post_json, d.unix, "/v1/ocr", {"image": b64png(11), "prompt": "x", "max_new_tokens": 800})
        wait_busy(d)
        d.signal(signal.SIGHUP)
        code, body = fut.result(60)
    assert code == 200 and json.loads(body)["generated_tokens"] > 0
    assert d.proc.wait(30) == 0 and "SIGHUP: draining 1 request(s)" in d.logtext() and not d.sock.exists()
    d.stop()
    # drain time over: the running (streamed) and the queued request get a shutting_down error, exit 0
    (tmp_path / "timeout").mkdir()
    d = Daemon(art_long, tmp_path / "timeout", "--drain-s", "1", "--max-new-tokens", "6000")
    d.wait_ready()
    s = open_request(d, dict(LONG, image=b64png(12), stream=True))
    wait_busy(d)
    with ThreadPoolExecutor(1) as ex:
        queued = ex.submit(post_json, d.unix, "/v1/ocr", dict(LONG, image=b64png(13)))
        time.sleep(0.3)
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        code, body = queued.result(30)
    assert code == 503 and error_of(body)["type"] == "shutting_down"
    reply = s.makefile("rb").read()
    s.close()
    head, _, chunked = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    lines = dechunk(chunked).decode().splitlines()
    assert len(lines) > 1 and "token" in json.loads(lines[0])
    last = json.loads(lines[-1])
    assert last["error"]["type"] == "shutting_down"
    assert d.proc.wait(30) == 0 and time.monotonic() - t0 < 6
    log = d.logtext()
    assert "drain time over: cancelling 2 request(s)" in log and "terminate called" not in log
    assert "Traceback" not in log
    d.stop()


def test_second_daemon_refuses_a_live_socket_and_replaces_a_stale_one(hostile, art_long, tmp_path):
    r = subprocess.run([*hostile.argv[:3], "serve", str(art_long), "--socket", str(hostile.sock), "--tcp",
                        f"127.0.0.1:{free_port()}", "--tcp-without-key", "true"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "another edgeocr daemon is listening" in r.stderr
    assert hostile.sock.exists()
    still_serving(hostile)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()                                   # the file stays, nothing listens
    (tmp_path / "s").mkdir()
    d = Daemon(art_long, tmp_path / "s", sock=stale)
    try:
        d.wait_ready()
        assert "removing stale socket file" in d.logtext()
    finally:
        d.stop()
    assert not stale.exists()
    regular = tmp_path / "file.sock"
    regular.write_text("x")
    r = subprocess.run([*hostile.argv[:3], "serve", str(art_long), "--socket", str(regular)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is not a socket" in r.stderr and regular.read_text() == "x"


def test_rss_stays_bounded_over_the_whole_suite(hostile):
    rss = hostile.rss_mib()
    print(f"daemon RSS {rss:.0f} MiB after the abuse suite, {hostile.baseline_rss:.0f} MiB after one request")
    assert rss - hostile.baseline_rss < RSS_GROWTH_MIB


def test_deadline_stops_generation_and_load_failure_exits_1(art_long, tmp_path):
    (tmp_path / "deadline").mkdir()
    d = Daemon(art_long, tmp_path / "deadline", "--deadline-s", "2", "--max-new-tokens", "6000")
    try:
        d.wait_ready()
        t0 = time.monotonic()
        code, body = post_json(d.unix, "/v1/ocr", dict(LONG, image=b64png(14)))
        assert code == 504 and error_of(body)["type"] == "deadline_exceeded" and time.monotonic() - t0 < 4
        assert wait_idle(d) < 1 and d.metric('edgeocr_cancelled_total{reason="deadline"}') == 1
    finally:
        d.stop()
    (tmp_path / "broken").mkdir()
    d = Daemon(tmp_path / "no-such-artifact", tmp_path / "broken")
    try:
        assert d.proc.wait(30) == 1
        assert "cannot load" in d.logtext() and "listening" not in d.logtext() and not d.sock.exists()
        d.notify.wait_for("STATUS=failed to load", timeout=5)
        assert not d.notify.seen("READY=1")
    finally:
        d.stop()
