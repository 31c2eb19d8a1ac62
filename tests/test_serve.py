"""The real daemon, started as a subprocess on a tiny artifact (Unix socket and loopback TCP, IPv4 and
IPv6): endpoints, formats, limits, queue, drain, settings, the page; plus the engine seam and the
request parsers as units."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from conftest import make_image
from edgeocr.serve import client_request
from serve_harness import (STARTED, Daemon, auth, b64png, error_of, free_port, multipart, parse_reply, pixel_bomb, png,
                           post_json)
from serve_harness import raw as raw_send

_png, _multipart, _auth, _pixel_bomb = png, multipart, auth, pixel_bomb


@pytest.fixture(autouse=True)
def _no_daemon_left_behind():
    """Module-scoped daemons stay; any daemon a test started itself is stopped even when the test fails."""
    before = list(STARTED)
    yield
    for d in [d for d in STARTED if d not in before]:
        d.stop()


@pytest.fixture(scope="module")
def daemon(art_a, tmp_path_factory):
    port = free_port()
    d = Daemon(art_a, tmp_path_factory.mktemp("daemon"), tcp=f"127.0.0.1:{port},[::1]:{port}")
    d.port, d.tcp = port, f"http://127.0.0.1:{port}"
    statuses = d.wait_ready()
    d.ready_statuses = statuses
    yield d
    d.stop()


def test_readiness_and_notify(daemon):
    assert 503 in daemon.ready_statuses, "ready must answer 503 while warming up"
    assert daemon.ready_statuses[-1] == 200
    n = daemon.notify
    t_ready = n.wait_for("READY=1", timeout=5)     # sent before readiness turns 200; the listener thread may lag
    t_status = n.seen("STATUS=loading")
    assert t_status is not None and t_status < t_ready
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
    status, headers, body = parse_reply(resp)
    assert status == 413 and error_of(body)["type"] == "payload_too_large" and headers["connection"] == "close"
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
    # one pixel limit and its message, never Pillow's; pages under the minimum; blank pages skip the model
    code, raw = post_json(daemon.unix, "/v1/ocr", {"image": base64.b64encode(_pixel_bomb()).decode()})
    msg = error_of(raw)["message"]
    assert code == 413 and "30000x30000 = 900,000,000 pixels exceeds the pixel limit of 40,000,000 (max_pixels" in msg
    assert "decompression" not in msg and "178956970" not in msg
    tiny, blank = io.BytesIO(), io.BytesIO()
    Image.new("RGB", (1, 1), "white").save(tiny, "PNG")
    Image.new("RGB", (400, 300), "white").save(blank, "PNG")
    code, raw = post_json(daemon.unix, "/v1/ocr", {"image": base64.b64encode(tiny.getvalue()).decode()})
    assert code == 400 and "smaller than the minimum page of 16x16 pixels" in error_of(raw)["message"]
    for stream in (False, True):
        code, raw = post_json(daemon.unix, "/v1/ocr", {"image": base64.b64encode(blank.getvalue()).decode(),
                                                       "stream": stream})
        r = json.loads(raw.splitlines()[-1])
        assert code == 200 and (r["finish_reason"], r["text"], r["generated_tokens"]) == ("blank", "", 0), raw
        assert len(raw.splitlines()) == 1                      # no token lines: the model did not run
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
    d.notify.wait_for("STOPPING=1", timeout=5)          # the listener thread may lag the exit
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
        assert d.proc.wait(10) == 0 and time.monotonic() - t0 < 5
    assert "SIGTERM again: exiting now" in d.logtext()
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


def test_remote_run_takes_the_same_inputs_and_writes_the_same_jsonl(daemon, art_a, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.png").write_bytes(_png(8))
    (d / "b.png").write_bytes(_png(9))
    pages = [Image.fromarray(make_image(20 + i, (200 + 20 * i, 300))) for i in range(2)]
    pages[0].save(tmp_path / "doc.pdf", "PDF", save_all=True, append_images=pages[1:], resolution=72.0)
    (tmp_path / "bad.png").write_bytes(b"nope")
    inputs = [str(d), f"{d}/*.png", str(tmp_path / "doc.pdf"), str(tmp_path / "bad.png")]

    def run(*args):
        return subprocess.run([sys.executable, "-m", "edgeocr", "run", *inputs, "--max-new-tokens", "3", *map(str, args)],
                              capture_output=True, text=True, timeout=300)

    r = run("--remote", daemon.unix)                            # text: a `== file` header per page
    assert r.returncode == 1 and "bad.png: not a recognized image format" in r.stderr, r.stderr
    assert [ln[3:] for ln in r.stdout.splitlines() if ln.startswith("== ")] == \
        [str(d / "a.png"), str(d / "b.png"), f"{tmp_path / 'doc.pdf'} page 1", f"{tmp_path / 'doc.pdf'} page 2"]
    assert r.stderr.count("(remote)") == 4
    local, remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    r = run("--model", art_a, "--threads", "1", "--out", local)
    assert r.returncode == 1
    r = run("--remote", daemon.unix, "--out", remote)
    assert r.returncode == 1 and "5 pages in" in r.stderr and f"-> {remote}" in r.stderr

    def by_page(path):
        return {(o["file"], o["page"]): o for o in map(json.loads, path.read_text().splitlines())}

    a, b = by_page(local), by_page(remote)
    assert a.keys() == b.keys() and len(a) == 5
    for k in a:
        assert a[k].keys() == b[k].keys(), k
        assert a[k].get("text") == b[k].get("text") and a[k].get("image_size") == b[k].get("image_size"), k
        assert a[k].get("error", {}).get("type") == b[k].get("error", {}).get("type"), k
    # --resume: the error line is dropped and its page retried, now readable
    (tmp_path / "bad.png").write_bytes(_png(10))
    r = run("--remote", daemon.unix, "--out", remote, "--resume")
    assert r.returncode == 0 and "4 pages already done, 1 to go (1 error line(s) removed; 1 of those pages run again)" \
        in r.stderr
    assert not any("error" in o for o in by_page(remote).values())
    # TCP with the key; stdout JSON has the --out keys
    r = run("--remote", daemon.tcp, "--api-key-file", daemon.tmp / "key", "--format", "json")
    objs, b = [json.loads(ln) for ln in r.stdout.splitlines()], by_page(remote)
    assert r.returncode == 0 and len(objs) == 5 and all(o.keys() == b[(o["file"], o["page"])].keys() for o in objs)
    r = subprocess.run([sys.executable, "-m", "edgeocr", "run", str(d / "a.png"), "--remote", daemon.tcp],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "missing or wrong API key" in r.stderr
    r = subprocess.run([sys.executable, "-m", "edgeocr", "doctor", "--remote", daemon.unix], capture_output=True,
                       text=True, timeout=120)
    assert "onnxruntime" in r.stdout and "HTTP 200 (ready)" in r.stdout


HOSTILE_HOSTS = ["::1", "::1:8090", "[::1", "[::1]x", "[::1]:80:80", "[::1]:", "[::1]]", "[[::1]]", "localhost:",
                 "localhost:abc", "localhost:+80", "localhost:-1", "localhost:٨٠", "localhost:99999",
                 "localhost:000080", "localhost:0x50", "localhost:80 ", " localhost", "localhost\t", "user@localhost",
                 "localhost@evil.com", "evil.com#localhost", "localhost/x", "localhost?x", "localhost\\x", "127.1",
                 "127.0.0.01", "0x7f.0.0.1", "[fe80::1%25lo]", "[fe80::1%lo]", "[v1.x]", "", "local_host",
                 "-localhost", "localhost.", "localhost%00", "loc alhost", "localhost:8090:8090", "lоcalhost"]


def test_host_header_is_parsed_strictly(daemon):
    from edgeocr.serve.parsing import parse_host
    assert parse_host("LocalHost:8090") == ("localhost", 8090)
    assert parse_host("127.0.0.1") == ("127.0.0.1", None)
    assert parse_host("[0:0:0:0:0:0:0:1]:65535") == ("[::1]", 65535)
    assert parse_host("example.com:1") == ("example.com", 1)
    for value in HOSTILE_HOSTS:
        with pytest.raises(ValueError):
            parse_host(value)
    # through the daemon's TCP guard: allowed hosts with a numeric port pass, hostile variants are refused
    for value in ("localhost:1", "[::1]:8090", "127.0.0.1", "LOCALHOST"):
        code, raw = client_request(daemon.tcp, "GET", "/v1/models", headers=_auth({"Host": value}))
        assert code == 200, (value, raw)
    for value in ("localhost:abc", "[::1]x", "localhost:", "127.0.0.1:99999", "localhost@evil.com",
                  "127.0.0.1.evil.com", "::1", "localhost:80:80"):
        code, raw = client_request(daemon.tcp, "GET", "/v1/models", headers=_auth({"Host": value}))
        assert code == 403 and error_of(raw)["type"] == "forbidden_host", (value, raw)


def test_page_works_in_headless_chromium(art_a, tmp_path):
    assert shutil.which("chromium"), "needs Debian's chromium: scripts/setup.sh installs it (as root)"
    d = Daemon(art_a, tmp_path, "--api-key-file", "", "--tcp-without-key", "true")
    try:
        d.wait_ready()
        assert "TCP WITHOUT AUTHENTICATION" in d.logtext()
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


def test_ipv6_loopback_models_openapi_and_security_headers(daemon):
    import http.client
    conn = http.client.HTTPConnection("::1", daemon.port, timeout=60)
    conn.request("POST", "/v1/ocr", json.dumps({"image": b64png(9), "max_new_tokens": 2}).encode(),
                 auth({"Host": f"[::1]:{daemon.port}", "Content-Type": "application/json"}))
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["generated_tokens"] == 2
    conn.close()
    code, raw = client_request(daemon.tcp, "GET", "/v1/models", headers=auth())
    models = json.loads(raw)
    assert code == 200 and models["object"] == "list" and models["data"][0]["id"] == "hunyuanocr"
    assert models["data"][0]["object"] == "model" and isinstance(models["data"][0]["created"], int)
    code, raw = client_request(daemon.tcp, "GET", "/v1/models/hunyuanocr", headers=auth())
    assert code == 200 and json.loads(raw)["id"] == "hunyuanocr"
    code, raw = client_request(daemon.tcp, "GET", "/v1/models/gpt-9", headers=auth())
    assert code == 404 and error_of(raw)["type"] == "model_not_found"
    code, raw = client_request(daemon.tcp, "GET", "/v1/models", headers={"Host": "127.0.0.1"})
    assert code == 401
    code, raw = client_request(daemon.unix, "GET", "/openapi.json")
    spec = json.loads(raw)
    assert code == 200 and spec["openapi"].startswith("3.") and "/v1/ocr" in spec["paths"]
    resp = raw_send(str(daemon.sock), b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    status, headers, body = parse_reply(resp)
    csp = headers["content-security-policy"]
    assert status == 200 and b"<canvas" in body and resp
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp
    assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"
    # a cross-origin browser request is refused on TCP
    code, raw = post_json(daemon.tcp, "/v1/ocr", {"image": b64png(9)}, auth({"Origin": "http://evil.example"}))
    assert code == 403 and error_of(raw)["type"] == "forbidden_origin"
    # wrong method: JSON 405 with Allow
    code, raw = client_request(daemon.unix, "GET", "/v1/ocr")
    assert code == 405 and error_of(raw)["type"] == "method_not_allowed"


def test_engine_scheduler_matches_recognize_and_cancels(art_a):
    """The engine seam on the real model: same tokens as recognize(); cancel frees the slot at once."""
    from edgeocr.decode import DecodeOptions
    from edgeocr.model import OCRModel

    model = OCRModel(art_a, threads=1)
    img = make_image(11, (300, 400))
    want = model.recognize(img, task="spotting", options=DecodeOptions(max_new_tokens=12))
    sched = model.scheduler(deltas=True)
    assert (sched.slots, sched.free(), sched.live()) == (1, 1, 0)
    tag = object()
    sched.admit(model.page(img, "spotting", None, "zh", DecodeOptions(max_new_tokens=12)), tag)
    assert (sched.free(), sched.live()) == (0, 1)
    with pytest.raises(RuntimeError):
        sched.admit(model.page(img, "spotting", None, "zh", DecodeOptions()), object())
    tokens, text, result = [], "", None
    for _ in range(100):
        for ev in sched.step():
            assert ev.tag is tag
            tokens.append(ev.token_id)
            text += ev.text_delta
            result = ev.result or result
        if result:
            break
    assert tokens == want.token_ids and result.token_ids == want.token_ids and result.finish_reason == "length"
    assert sched.free() == 1 and sched.step() == []
    # cancel after a few tokens: the slot is free when cancel returns, the result says cancelled
    sched.admit(model.page(img, None, "x", "zh", DecodeOptions(max_new_tokens=400)), tag)
    for _ in range(5):
        sched.step()
    r = sched.cancel(tag)
    assert r.finish_reason == "cancelled" and 5 <= r.generated_tokens <= 6 and sched.free() == 1
    assert sched.cancel(tag) is None
    # bad input is refused at admission, the slot stays free
    from edgeocr.errors import ImageError
    with pytest.raises(ImageError):
        sched.admit(model.page(b"not an image", None, "x", "zh", DecodeOptions()), tag)
    assert sched.free() == 1


def test_parsers_refuse_hostile_bodies():
    """Every malformed field is a 400 (or 413) HTTPError naming it; never another exception."""
    from edgeocr.serve.config import ServerConfig
    from edgeocr.serve.errors import HTTPError
    from edgeocr.serve.parsing import chat_params, ocr_from_json, ocr_from_multipart

    cfg = ServerConfig(artifact="x", max_new_tokens=100, default_max_new_tokens=50)
    img = b64png(1, (140, 160))
    uri = "data:image/png;base64," + img
    good = ocr_from_json(json.dumps({"image": img, "task": "spotting", "max_new_tokens": 7}).encode(), cfg)
    assert (good.task, good.max_new_tokens, good.image_size, good.stream) == ("spotting", 7, (160, 140), False)
    bodies = [b"[" * 100000 + b"]" * 100000, b'{"image": ' + b"9" * 5000 + b"}", b"\xff\xfe{", b"", b"[]", b"5",
              b'{"image": "x", "image": 5}', b'{"image": NaN}']
    for body in bodies:
        with pytest.raises(HTTPError) as e:
            ocr_from_json(body, cfg)
        assert e.value.status == 400, body[:40]
    fields = [{"task": ["spotting"]}, {"task": "poetry"}, {"prompt": 5}, {"prompt": "   "}, {"prompt": "\ud800"},
              {"lang": "fr"}, {"lang": None}, {"max_new_tokens": "5"}, {"max_new_tokens": 5.0},
              {"max_new_tokens": True}, {"max_new_tokens": 0}, {"max_new_tokens": 101}, {"max_new_tokens": 10 ** 40},
              {"stream": "yes"}, {"stream": 1}, {"image": 5}, {"image": ["a"]}, {"image": ""}, {"image": "%%%"},
              {"image": "data:image/png,abc"}, {"image": "https://example.com/a.png"},
              {"image": base64.b64encode(b"GIF89a").decode()}, {"task": "spotting", "prompt": "x"}, {"extra": 1}]
    for f in fields:
        body = json.dumps(dict({"image": img}, **f)).encode()
        with pytest.raises(HTTPError) as e:
            ocr_from_json(body, cfg)
        assert e.value.status == 400 and e.value.message, f
    with pytest.raises(HTTPError) as e:
        ocr_from_json(json.dumps({"image": base64.b64encode(pixel_bomb(9000, 9000)).decode()}).encode(), cfg)
    assert e.value.status == 413
    chats = [{"messages": []}, {"messages": "hi"}, {"messages": [5]}, {"messages": [{"role": 5, "content": "x"}]},
             {"messages": [{"role": "user", "content": 5}]}, {"messages": [{"role": "user", "content": [5]}]},
             {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
             {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]},
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}] * 2}]},
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}]}],
              "max_tokens": "9"},
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}]}], "n": 2},
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}]}],
              "model": ["x"]},
             {"messages": [{"role": "user", "content": "no image here"}]}]
    for c in chats:
        with pytest.raises(HTTPError) as e:
            chat_params(json.dumps(c).encode(), cfg)
        assert e.value.status == 400, c
    ok = chat_params(json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "Read."}]}],
        "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}).encode(), cfg)
    assert (ok.prompt, ok.task, ok.max_new_tokens, ok.stream, ok.include_usage) == ("Read.", None, 5, True, True)
    body, ctype = multipart({"task": "spotting", "max_new_tokens": "3"}, png(1, (140, 160)))
    mp = ocr_from_multipart(body, ctype, cfg)
    assert (mp.task, mp.max_new_tokens) == ("spotting", 3)
    for bad_body, bad_ctype in [(body, "multipart/form-data"), (body[:-20], ctype), (b"--x\r\n", ctype),
                                (body, "multipart/form-data; boundary=other"),
                                (multipart({"max_new_tokens": "-1"}, png(1))[0], ctype),
                                (multipart({"max_new_tokens": "9" * 50}, png(1))[0], ctype),
                                (multipart({"stream": "maybe"}, png(1))[0], ctype),
                                (multipart({"colour": "red"}, png(1))[0], ctype)]:
        with pytest.raises(HTTPError) as e:
            ocr_from_multipart(bad_body, bad_ctype, cfg)
        assert e.value.status == 400


def test_parsers_hold_what_a_hostile_client_tried():
    """Each case a hostile-client pass found: a non-ASCII digit in a form field (was a 500), a JSON body of
    thousands of empty objects (parsed at ~25x its size before), part headers whose parameters made the standard
    library's parser quadratic (seconds for 16 parts of 8 KiB), a chat token limit named by the client's own
    field, and base64 as `base64 FILE` and URL-safe encoders write it."""
    from edgeocr.serve.config import ServerConfig
    from edgeocr.serve.errors import HTTPError
    from edgeocr.serve.parsing import MAX_JSON_CONTAINERS, chat_params, header_params, ocr_from_json, \
        ocr_from_multipart

    cfg = ServerConfig(artifact="x", max_new_tokens=100, default_max_new_tokens=50)
    for digits in ("\u00b2", "\u0663", "\uff15"):                  # superscript two, Arabic-Indic three, fullwidth 5
        body, ctype = multipart({"max_new_tokens": digits}, png(1, (140, 160)))
        with pytest.raises(HTTPError) as e:
            ocr_from_multipart(body, ctype, cfg)
        assert e.value.status == 400 and "'max_new_tokens' must be a positive integer" in e.value.message
    img = b64png(1, (140, 160))
    with pytest.raises(HTTPError) as e:
        ocr_from_json(json.dumps({"image": img, "x": [{}] * (MAX_JSON_CONTAINERS + 1)}).encode(), cfg)
    assert e.value.status == 400 and e.value.type == "invalid_json" and str(MAX_JSON_CONTAINERS) in e.value.message
    # parameters: quoted separators and escapes, case, a trailing semicolon; one that does not parse is skipped
    assert header_params('Form-Data; NAME="a;b\\"c"; filename=x.png;') == ("form-data", {"name": 'a;b"c',
                                                                                      "filename": "x.png"})
    assert header_params("multipart/form-data;; boundary=----x1; charset=utf-8")[1] == {"boundary": "----x1",
                                                                                      "charset": "utf-8"}
    assert header_params('form-data; name="image"; filename="scan\\"')[1] == {"name": "image"}   # a browser's
    for bad in ('form-data; name="open', "form-data; =x", "form-data; name"):                   # unescaped "\"
        assert "name" not in header_params(bad)[1], bad
    # a multipart part whose name cannot be read is a 400 naming that
    image_part, ctype = multipart({}, png(1, (140, 160)))
    with pytest.raises(HTTPError) as e:
        ocr_from_multipart(image_part.replace(b'name="image"', b"name"), ctype, cfg)
    assert e.value.status == 400 and "without a Content-Disposition name" in e.value.message
    # unpadded standard base64, and JSON braces inside strings (LaTeX in an earlier answer) are not containers
    assert ocr_from_json(json.dumps({"image": img.rstrip("=")}).encode(), cfg).image_size == (160, 140)
    latex = "\\frac{a_{i}}{b^{2}}" * 1500
    assert chat_params(json.dumps({"messages": [{"role": "assistant", "content": latex}, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + img}}]}]}).encode(), cfg).task
    parts = b"".join(b'------edgeocrtest\r\nContent-Disposition: form-data; name="a%d' % i + b";" * 8100
                     + b'"\r\n\r\nx\r\n' for i in range(15))
    with pytest.raises(HTTPError) as e:
        ocr_from_multipart(parts + image_part, ctype, cfg)
    assert e.value.status == 400 and "unknown form field" in e.value.message
    uri = "data:image/png;base64," + img
    for key, value in (("max_tokens", 101), ("max_completion_tokens", 0), ("max_tokens", "9")):
        with pytest.raises(HTTPError) as e:
            chat_params(json.dumps({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": uri}}]}], key: value}).encode(), cfg)
        assert e.value.status == 400 and f"'{key}'" in e.value.message and "max_new_tokens" not in e.value.message
    raw_png = base64.b64decode(img)
    wrapped = "\n".join(img[i:i + 76] for i in range(0, len(img), 76))
    urlsafe = base64.urlsafe_b64encode(raw_png).decode().rstrip("=")
    for text_ in (wrapped, urlsafe, "data:image/png;base64," + wrapped):
        assert ocr_from_json(json.dumps({"image": text_}).encode(), cfg).image_size == (160, 140)
    with pytest.raises(HTTPError) as e:
        ocr_from_json(json.dumps({"image": img[:-3] + "+-_"}).encode(), cfg)
    assert e.value.status == 400 and "'image' is not valid base64 (" in e.value.message
    with pytest.raises(HTTPError) as e:                     # a PDF is named as one, with the way to send it
        ocr_from_json(json.dumps({"image": base64.b64encode(b"%PDF-1.7\n%...").decode()}).encode(), cfg)
    assert e.value.status == 400 and "a PDF; the daemon reads images only" in e.value.message


def test_config_refuses_bad_settings(tmp_path):
    import argparse

    from edgeocr.serve_config import ConfigError, add_arguments, resolve
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    for argv, msg in [(["a", "--queue-size", "0"], "queue_size"), (["a", "--body-timeout-s", "0"], "body_timeout_s"),
                      (["a", "--header-timeout-s", "nan"], "bad value"), (["a", "--device", "tpu"], "device"),
                      (["a", "--log-level", "loud"], "log_level"), (["a", "--max-connections", "-1"], "max_connections"),
                      (["a", "--default-max-new-tokens", "99", "--max-new-tokens", "10"], "default_max_new_tokens"),
                      (["a", "--tcp", "127.0.0.1:8090"],
                       "TCP needs a Bearer key file \\(--api-key-file.* --tcp-without-key \\(tcp_without_key = true\\)"),
                      (["a", "--allowed-hosts", "localhost,evil.com:80"], "without a port"),
                      (["a", "--allowed-hosts", "local host"], "allowed_hosts entry")]:
        with pytest.raises(ConfigError, match=msg):
            resolve(ap.parse_args(argv), {})
    cfg = resolve(ap.parse_args(["a", "--tcp", "127.0.0.1:8090"]), {"EDGEOCR_TCP_WITHOUT_KEY": "true"})
    assert cfg.tcp_without_key and not cfg.api_key_file
    # an on/off setting as a bare flag means on; a value still works
    cfg = resolve(ap.parse_args(["a", "--tcp", "127.0.0.1:8090", "--tcp-without-key", "--metrics"]), {})
    assert cfg.tcp_without_key and cfg.metrics
    assert not resolve(ap.parse_args(["a", "--metrics", "false"]), {}).metrics
    with pytest.raises(ConfigError, match="put it after ARTIFACT"):        # the flag took the artifact's path
        resolve(ap.parse_args(["--metrics", "/srv/art"]), {})
    cfg = resolve(ap.parse_args(["a"]), {"EDGEOCR_HEADER_TIMEOUT_S": "3.5", "EDGEOCR_BACKLOG": "64"})
    assert (cfg.header_timeout_s, cfg.backlog) == (3.5, 64)
    from edgeocr.errors import EdgeOCRError
    from edgeocr.serve.daemon import parse_tcp
    assert parse_tcp("127.0.0.1:80,[::1]:81") == [(socket.AF_INET, "127.0.0.1", 80), (socket.AF_INET6, "::1", 81)]
    assert len(parse_tcp("localhost:0")) == 2
    for bad in ("0.0.0.0:80", "[::]:80", "10.1.2.3:80", "example.com:80", "127.0.0.1", "127.0.0.1:99999"):
        with pytest.raises(EdgeOCRError):
            parse_tcp(bad)
    from edgeocr.serve.daemon import bind_unix
    (tmp_path / "afile").write_text("x")          # a socket folder that cannot be made names the socket and a fix
    with pytest.raises(EdgeOCRError, match=r"socket .*x.sock: cannot create its folder .*\(--socket"):
        bind_unix(str(tmp_path / "afile" / "d" / "x.sock"), 0o600, 8)


def test_slot_artifact_serves_requests_at_once(ckpt_a, tmp_path):
    """A 3-slot artifact: three requests decode at the same time (slots_busy reaches 3, a fourth waits in
    the queue), each reply equals that page decoded alone, one of them streamed."""
    from conftest import _export
    from edgeocr.decode import DecodeOptions
    from edgeocr.model import OCRModel
    art = _export(ckpt_a, tmp_path / "s3", slots=3, attention="gqa", select_on_device=True)
    pages = [make_image(60 + i, (300, 400)) for i in range(4)]
    alone = OCRModel(art, threads=1)
    want = [alone.recognize(p, prompt="x", options=DecodeOptions(max_new_tokens=150)).text for p in pages]
    d = Daemon(art, tmp_path)
    try:
        d.wait_ready()
        info = json.loads(client_request(d.unix, "GET", "/v1/info")[1])
        assert info["slots"] == 3
        bodies = [{"image": base64.b64encode(_png_of(p)).decode(), "max_new_tokens": 150, "prompt": "x"}
                  for p in pages]
        busy = []

        def watch():
            end = time.monotonic() + 60
            while time.monotonic() < end and max(busy, default=0) < 3:
                r = json.loads(client_request(d.unix, "GET", "/health/ready")[1])
                busy.append(r.get("slots_busy", 0))

        with ThreadPoolExecutor(5) as ex:
            w = ex.submit(watch)
            futs = [ex.submit(post_json, d.unix, "/v1/ocr", b) for b in bodies]
            results = [f.result() for f in futs]
            w.result()
        assert max(busy) == 3, busy
        assert [c for c, _ in results] == [200] * 4
        assert [json.loads(raw)["text"] for _, raw in results] == want
    finally:
        d.stop()


def _png_of(img) -> bytes:
    import io

    from PIL import Image
    b = io.BytesIO()
    Image.fromarray(img).save(b, "PNG")
    return b.getvalue()
