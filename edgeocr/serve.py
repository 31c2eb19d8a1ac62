"""`edgeocr serve`: a local OCR daemon (stdlib HTTP, no extra dependency).

One worker thread owns the engine; requests wait in a bounded queue (full -> 503 + Retry-After).
Unix socket by default, optional loopback TCP guarded by a Bearer key file and a Host-header check.
systemd: Type=notify readiness after warm-up, STATUS lines, watchdog pings from the worker loop,
STOPPING and a bounded drain on SIGTERM (a second signal exits at once).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import queue
import signal
import socket
import socketserver
import threading
import time
import uuid
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from edgeocr import __version__, preprocess, prompts
from edgeocr.decode import DecodeOptions
from edgeocr.errors import EdgeOCRError, ImageError, ImageTooLarge, PromptError
from edgeocr.sdnotify import Notifier
from edgeocr.serve_config import ServerConfig

log = logging.getLogger("edgeocr.serve")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class HTTPError(Exception):
    def __init__(self, status: int, type_: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.type, self.message, self.headers = status, type_, message, headers or {}


@dataclass
class Job:
    id: str
    image: object                       # PIL image, already decoded and size-checked
    task: str | None
    prompt: str | None
    lang: str
    max_new_tokens: int
    stream: bool
    deadline: float                     # time.monotonic() by which it must finish
    enqueued: float = field(default_factory=time.monotonic)
    events: "queue.Queue" = field(default_factory=queue.Queue)   # streaming: (token, delta) then None
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: HTTPError | None = None
    started: float = 0.0
    chat_model: str = "hunyuanocr"      # OpenAI requests: the model name to echo back


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.lat_sum, self.lat_count = 0.0, 0
        self.gen_tokens = self.prompt_tokens = 0

    def observe(self, endpoint: str, status: int, seconds: float, gen: int = 0, prompt: int = 0) -> None:
        with self.lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1
            i = next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))
            self.buckets[i] += 1
            self.lat_sum += seconds
            self.lat_count += 1
            self.gen_tokens += gen
            self.prompt_tokens += prompt

    def render(self, depth: int) -> str:
        with self.lock:
            out = ["# HELP edgeocr_requests_total Requests by endpoint and HTTP status.",
                   "# TYPE edgeocr_requests_total counter"]
            for (ep, st), n in sorted(self.requests.items()):
                out.append(f'edgeocr_requests_total{{endpoint="{ep}",status="{st}"}} {n}')
            out += ["# HELP edgeocr_request_seconds OCR request latency.", "# TYPE edgeocr_request_seconds histogram"]
            acc = 0
            for b, n in zip(LATENCY_BUCKETS, self.buckets):
                acc += n
                out.append(f'edgeocr_request_seconds_bucket{{le="{b}"}} {acc}')
            out.append(f'edgeocr_request_seconds_bucket{{le="+Inf"}} {acc + self.buckets[-1]}')
            out += [f"edgeocr_request_seconds_sum {self.lat_sum:.6f}", f"edgeocr_request_seconds_count {self.lat_count}",
                    "# HELP edgeocr_queue_depth Requests waiting for the engine.", "# TYPE edgeocr_queue_depth gauge",
                    f"edgeocr_queue_depth {depth}",
                    "# HELP edgeocr_generated_tokens_total Tokens generated.", "# TYPE edgeocr_generated_tokens_total counter",
                    f"edgeocr_generated_tokens_total {self.gen_tokens}",
                    "# HELP edgeocr_prompt_tokens_total Prompt tokens processed.", "# TYPE edgeocr_prompt_tokens_total counter",
                    f"edgeocr_prompt_tokens_total {self.prompt_tokens}"]
        return "\n".join(out) + "\n"


class Engine(threading.Thread):
    """The one thread that owns the model."""

    def __init__(self, cfg: ServerConfig, notifier: Notifier):
        super().__init__(name="edgeocr-engine", daemon=True)
        self.cfg, self.notifier = cfg, notifier
        self.queue: queue.Queue[Job] = queue.Queue(maxsize=cfg.queue_size)
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.busy = False
        self.stop_requested = False
        self.load_error: str | None = None
        self.model = None
        self.info: dict = {}
        wd = notifier.watchdog_usec / 1e6
        self.tick = min(1.0, wd / 4) if wd else 1.0

    def run(self) -> None:
        try:
            self._load()
        except Exception as e:  # a failed load is reported, never hangs the unit
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("cannot load %s: %s", self.cfg.artifact, self.load_error)
            self.notifier.status(f"failed to load: {self.load_error}")
            self.stopped.set()
            return
        while True:
            self.notifier.watchdog()
            try:
                job = self.queue.get(timeout=self.tick)
            except queue.Empty:
                if self.stop_requested:
                    break
                continue
            self.busy = True
            try:
                self._run(job)
            finally:
                self.busy = False
                job.done.set()
                job.events.put(None)
        self.stopped.set()

    def _load(self) -> None:
        from edgeocr.model import OCRModel

        self.notifier.status(f"loading {self.cfg.artifact}")
        t0 = time.perf_counter()
        self.model = OCRModel(self.cfg.artifact, device=self.cfg.device, threads=self.cfg.threads or None)
        m = self.model.manifest
        mh = hashlib.sha256((Path(self.cfg.artifact) / "manifest.json").read_bytes()).hexdigest()
        self.info = {"version": __version__, "backend": self.model.session.name, "precision": m.precision,
                     "device": self.cfg.device, "manifest_sha256": mh, "artifact": str(self.cfg.artifact),
                     "source_sha256": m.source.get("sha256"), "kv_cache_tokens": m.kv_cache["max_len"],
                     "max_new_tokens": self.cfg.max_new_tokens, "tasks": prompts.task_names()}
        log.info("loaded %s (%s, %s) in %.1f s", self.cfg.artifact, m.precision, self.model.session.name,
                 time.perf_counter() - t0)
        if self.cfg.warmup:
            self.notifier.status("warming up")
            import numpy as np
            img = np.full((256, 256, 3), 255, np.uint8)
            img[100:140, 40:200] = 0
            self.model.recognize(img, options=DecodeOptions(max_new_tokens=2))
            log.info("warm-up done in %.1f s", time.perf_counter() - t0)
        self.ready.set()
        self.notifier.status("ready")
        self.notifier.ready()

    def _run(self, job: Job) -> None:
        job.started = time.monotonic()
        if job.started > job.deadline:
            job.error = HTTPError(504, "deadline_exceeded", "the request waited past its deadline in the queue")
            return
        n = 0

        def stop_check() -> bool:
            nonlocal n
            n += 1
            if n % 16 == 0:
                self.notifier.watchdog()        # long generations keep the watchdog fed
            return time.monotonic() > job.deadline

        opts = DecodeOptions(max_new_tokens=job.max_new_tokens)
        try:
            if job.stream:
                for tok, delta in self.model.stream(job.image, job.task, job.prompt, job.lang, opts, stop_check):
                    job.events.put((tok, delta))
                job.result = self.model.last_result
            else:
                job.result = self.model.recognize(job.image, job.task, job.prompt, job.lang, opts,
                                                  stop_check=stop_check)
            if job.result.finish_reason == "cancelled":
                job.error = HTTPError(504, "deadline_exceeded",
                                      f"generation stopped at the {self.cfg.deadline_s:g} s deadline")
        except (ImageError, PromptError) as e:
            job.error = HTTPError(400, "invalid_request", str(e))
        except Exception as e:
            log.exception("request %s failed", job.id)
            job.error = HTTPError(500, "internal_error", f"{type(e).__name__}: {e}")


class Daemon:
    def __init__(self, cfg: ServerConfig, notifier: Notifier | None = None):
        self.cfg = cfg
        self.notifier = notifier or Notifier()
        self.engine = Engine(cfg, self.notifier)
        self.metrics = Metrics()
        self.draining = False
        self.api_key = None
        if cfg.api_key_file:
            try:
                self.api_key = Path(cfg.api_key_file).read_text().strip()
            except OSError as e:
                raise EdgeOCRError(f"api_key_file {cfg.api_key_file}: {e.strerror}") from None
            if not self.api_key:
                raise EdgeOCRError(f"api_key_file {cfg.api_key_file} is empty")
        self.allowed_hosts = {h.strip().lower() for h in cfg.allowed_hosts.split(",") if h.strip()}
        self.servers: list[socketserver.BaseServer] = []
        self.shutdown = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        handler = make_handler(self)
        if self.cfg.socket:
            path = Path(self.cfg.socket)
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_socket():
                path.unlink()        # stale socket from a previous run
            srv = UnixHTTPServer(str(path), handler)
            os.chmod(path, self.cfg.socket_mode)
            self.servers.append(srv)
            log.info("listening on unix:%s", path)
        if self.cfg.tcp:
            host, _, port = self.cfg.tcp.rpartition(":")
            host = host.strip("[]") or "127.0.0.1"
            if host not in ("127.0.0.1", "localhost", "::1"):
                raise EdgeOCRError(f"tcp {self.cfg.tcp}: only loopback addresses are allowed")
            srv = ThreadingHTTPServer((host, int(port)), handler)
            srv.daemon_threads = True
            self.servers.append(srv)
            log.info("listening on http://%s:%d", host, srv.server_address[1])
            self.notifier.status(f"listening on {host}:{srv.server_address[1]}, loading")
        for s in self.servers:
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        self.engine.start()

    def tcp_port(self) -> int | None:
        for s in self.servers:
            if isinstance(s, ThreadingHTTPServer):
                return s.server_address[1]
        return None

    def begin_drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        self.notifier.stopping()
        self.notifier.status("draining")
        log.info("SIGTERM: draining (up to %.0f s), refusing new requests", self.cfg.drain_s)

        def drain():
            end = time.monotonic() + self.cfg.drain_s
            while time.monotonic() < end and (self.engine.busy or not self.engine.queue.empty()):
                time.sleep(0.05)
            left = self.engine.queue.qsize() + int(self.engine.busy)
            if left:
                log.warning("drain time over with %d request(s) unfinished", left)
            self.engine.stop_requested = True
            time.sleep(0.2)          # let finished responses reach their clients
            self.shutdown.set()

        threading.Thread(target=drain, daemon=True).start()

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()
        if self.cfg.socket:
            try:
                Path(self.cfg.socket).unlink()
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ requests
    def submit(self, job: Job) -> None:
        if self.draining:
            raise HTTPError(503, "shutting_down", "the server is shutting down", {"Retry-After": "5"})
        if not self.engine.ready.is_set():
            raise HTTPError(503, "not_ready", "the model is still loading", {"Retry-After": "2"})
        try:
            self.engine.queue.put_nowait(job)
        except queue.Full:
            raise HTTPError(503, "overloaded", f"queue full ({self.cfg.queue_size} waiting)",
                            {"Retry-After": str(max(1, round(self.cfg.deadline_s / 10)))}) from None


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


def _error_body(e: HTTPError) -> bytes:
    return json.dumps({"error": {"code": e.status, "type": e.type, "message": e.message}}).encode()


def _b64_image(s: str) -> bytes:
    if not isinstance(s, str) or not s:
        raise HTTPError(400, "invalid_request", "'image' must be a base64 string or a data: URI")
    if s.startswith("data:"):
        head, _, s = s.partition(",")
        if ";base64" not in head:
            raise HTTPError(400, "invalid_request", "data URI must be base64-encoded")
    elif s.startswith(("http://", "https://", "file:")):
        raise HTTPError(400, "invalid_request", "image URLs are not fetched; send the image as base64 or a data: URI")
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPError(400, "invalid_request", "'image' is not valid base64") from None


def make_handler(d: Daemon):
    cfg = d.cfg

    class Handler(BaseHTTPRequestHandler):
        server_version = f"edgeocr/{__version__}"
        protocol_version = "HTTP/1.0"

        def address_string(self) -> str:
            return self.client_address[0] if isinstance(self.client_address, tuple) else "unix"

        def log_message(self, fmt, *args):   # one line per request is logged by _finish instead
            pass

        # -------------------------------------------------------------- plumbing
        def _is_tcp(self) -> bool:
            return isinstance(self.client_address, tuple)

        def _send(self, status: int, body: bytes, ctype: str = "application/json", headers: dict | None = None):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
            self.status = status

        def _json(self, status: int, obj) -> None:
            self._send(status, json.dumps(obj, ensure_ascii=False).encode())

        def _finish(self, t0: float, tokens: int = 0, prompt_tokens: int = 0, wait_ms: float = 0.0):
            dt = time.monotonic() - t0
            endpoint = self.path.split("?")[0]
            if endpoint.startswith(("/v1/", "/metrics", "/health")) or endpoint == "/":
                d.metrics.observe(endpoint, getattr(self, "status", 0), dt, tokens, prompt_tokens)
            log.info("%s %s %s %d %.0fms tokens=%d queue_wait=%.0fms", getattr(self, "rid", "-"), self.command,
                     endpoint, getattr(self, "status", 0), dt * 1e3, tokens, wait_ms)

        def _guard(self, public: bool = False) -> None:
            if not self._is_tcp():
                return
            host = (self.headers.get("Host") or "").strip().lower()
            name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
            if name not in d.allowed_hosts:
                raise HTTPError(403, "forbidden_host", f"Host header {host!r} is not allowed")
            if d.api_key and not public:
                auth = self.headers.get("Authorization", "")
                if not (auth.startswith("Bearer ") and
                        hashlib.sha256(auth[7:].strip().encode()).digest() == hashlib.sha256(d.api_key.encode()).digest()):
                    raise HTTPError(401, "unauthorized", "missing or wrong API key (Authorization: Bearer KEY)",
                                    {"WWW-Authenticate": "Bearer"})

        def _body(self) -> bytes:
            n = self.headers.get("Content-Length")
            if n is None:
                raise HTTPError(411, "length_required", "Content-Length is required")
            try:
                n = int(n)
            except ValueError:
                raise HTTPError(400, "invalid_request", "bad Content-Length") from None
            if n > cfg.max_body_bytes:
                self.close_connection = True
                raise HTTPError(413, "payload_too_large", f"body of {n} bytes exceeds {cfg.max_body_bytes}")
            return self.rfile.read(n)

        # -------------------------------------------------------------- routes
        def do_GET(self):
            t0 = time.monotonic()
            path = self.path.split("?")[0]
            try:
                self._guard(public=path in ("/health/live", "/health/ready", "/", "/sample.png"))
                if path == "/health/live":
                    self._json(200, {"status": "live"})
                elif path == "/health/ready":
                    if d.engine.load_error:
                        raise HTTPError(503, "load_failed", d.engine.load_error)
                    if d.draining:
                        raise HTTPError(503, "shutting_down", "draining")
                    if not d.engine.ready.is_set():
                        raise HTTPError(503, "not_ready", "loading or warming up", {"Retry-After": "2"})
                    self._json(200, {"status": "ready", "queue_depth": d.engine.queue.qsize()})
                elif path == "/v1/info":
                    if not d.engine.info:
                        raise HTTPError(503, "not_ready", "loading")
                    self._json(200, dict(d.engine.info, queue_size=cfg.queue_size, ready=d.engine.ready.is_set()))
                elif path == "/metrics" and cfg.metrics:
                    self._send(200, d.metrics.render(d.engine.queue.qsize()).encode(), "text/plain; version=0.0.4")
                elif path == "/":
                    from edgeocr.webpage import PAGE
                    self._send(200, PAGE.encode(), "text/html; charset=utf-8")
                elif path == "/sample.png":
                    from edgeocr.webpage import sample_png
                    self._send(200, sample_png(), "image/png")
                else:
                    raise HTTPError(404, "not_found", f"no route {path}")
            except HTTPError as e:
                self._send(e.status, _error_body(e), headers=e.headers)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self._finish(t0)

        def do_POST(self):
            t0 = time.monotonic()
            self.rid = uuid.uuid4().hex[:12]
            path = self.path.split("?")[0]
            tokens = prompt_tokens = 0
            wait_ms = 0.0
            try:
                self._guard()
                if path not in ("/v1/ocr", "/v1/chat/completions"):
                    raise HTTPError(404, "not_found", f"no route {path}")
                body = self._body()
                job, chat = (self._parse_ocr(body) if path == "/v1/ocr" else self._parse_chat(body))
                d.submit(job)
                if job.stream:
                    tokens, prompt_tokens = self._stream(job, chat)
                else:
                    if not job.done.wait(timeout=max(0.0, job.deadline - time.monotonic()) + 5):
                        raise HTTPError(504, "deadline_exceeded", "no result before the deadline")
                    wait_ms = (job.started - job.enqueued) * 1e3 if job.started else 0.0
                    if job.error:
                        raise job.error
                    r = job.result
                    tokens, prompt_tokens = r.generated_tokens, r.prompt_tokens
                    self._json(200, _chat_response(job, r) if chat else dict(r.to_dict(), id=job.id))
            except HTTPError as e:
                try:
                    self._send(e.status, _error_body(e), headers=e.headers)
                except (BrokenPipeError, ConnectionResetError):
                    pass
            except (BrokenPipeError, ConnectionResetError):
                pass
            self._finish(t0, tokens, prompt_tokens, wait_ms)

        # -------------------------------------------------------------- parsing
        def _job(self, image_bytes: bytes, task, prompt, lang, max_new, stream) -> Job:
            if task is not None and task not in prompts.TASKS_ZH:
                raise HTTPError(400, "invalid_request", f"unknown task {task!r}; see /v1/info for the list")
            if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
                raise HTTPError(400, "invalid_request", "'prompt' must be a non-empty string")
            if lang not in ("zh", "en"):
                raise HTTPError(400, "invalid_request", "'lang' must be 'zh' or 'en'")
            if max_new is None:
                max_new = cfg.default_max_new_tokens
            if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
                raise HTTPError(400, "invalid_request", f"'max_new_tokens' must be a positive integer, got {max_new!r}")
            if max_new > cfg.max_new_tokens:
                raise HTTPError(400, "invalid_request", f"'max_new_tokens' {max_new} exceeds the cap {cfg.max_new_tokens}")
            if task and lang == "en" and task not in prompts.TASKS_EN:
                raise HTTPError(400, "invalid_request", f"task {task!r} has no English prompt")
            try:
                image = preprocess.decode_bytes(image_bytes, "image", max_pixels=cfg.max_pixels)
            except ImageTooLarge as e:
                raise HTTPError(413, "invalid_image", str(e)) from None
            except ImageError as e:
                raise HTTPError(400, "invalid_image", str(e)) from None
            return Job(id=self.rid, image=image, task=task, prompt=prompt, lang=lang, max_new_tokens=max_new,
                       stream=bool(stream), deadline=time.monotonic() + cfg.deadline_s)

        def _parse_ocr(self, body: bytes):
            ctype = self.headers.get("Content-Type", "")
            if ctype.startswith("multipart/form-data"):
                msg = BytesParser(policy=email_policy).parsebytes(
                    b"Content-Type: " + ctype.encode() + b"\r\nMIME-Version: 1.0\r\n\r\n" + body)
                if not msg.is_multipart():
                    raise HTTPError(400, "invalid_request", "malformed multipart body")
                form, image = {}, None
                for part in msg.iter_parts():
                    name = part.get_param("name", header="content-disposition")
                    data = part.get_payload(decode=True) or b""
                    if name == "image":
                        image = data
                    elif name:
                        form[name] = data.decode("utf-8", "replace")
                if image is None:
                    raise HTTPError(400, "invalid_request", "multipart body has no 'image' file field")
                try:
                    mx = int(form["max_new_tokens"]) if form.get("max_new_tokens") else None
                except ValueError:
                    raise HTTPError(400, "invalid_request", "'max_new_tokens' must be an integer") from None
                return self._job(image, form.get("task") or None, form.get("prompt") or None, form.get("lang", "zh"),
                                 mx, form.get("stream", "").lower() in ("1", "true", "yes")), False
            if ctype.startswith("application/json") or not ctype:
                try:
                    req = json.loads(body)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise HTTPError(400, "invalid_json", f"body is not valid JSON: {e}") from None
                if not isinstance(req, dict):
                    raise HTTPError(400, "invalid_request", "body must be a JSON object")
                unknown = set(req) - {"image", "task", "prompt", "lang", "max_new_tokens", "stream"}
                if unknown:
                    raise HTTPError(400, "invalid_request", f"unknown field(s) {sorted(unknown)}")
                return self._job(_b64_image(req.get("image")), req.get("task"), req.get("prompt"),
                                 req.get("lang", "zh"), req.get("max_new_tokens"), req.get("stream", False)), False
            raise HTTPError(415, "unsupported_media_type", f"Content-Type {ctype!r}; use multipart/form-data or JSON")

        def _parse_chat(self, body: bytes):
            try:
                req = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise HTTPError(400, "invalid_json", f"body is not valid JSON: {e}") from None
            msgs = req.get("messages") if isinstance(req, dict) else None
            if not isinstance(msgs, list) or not msgs:
                raise HTTPError(400, "invalid_request", "'messages' must be a non-empty list")
            image, text = None, []
            for m in msgs:
                if not isinstance(m, dict) or m.get("role") != "user":
                    continue
                content = m.get("content")
                parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
                for p in parts:
                    if not isinstance(p, dict):
                        continue
                    if p.get("type") == "image_url":
                        url = p.get("image_url", {}).get("url") if isinstance(p.get("image_url"), dict) else p.get("image_url")
                        image = _b64_image(url)
                    elif p.get("type") == "text" and p.get("text"):
                        text.append(p["text"])
            if image is None:
                raise HTTPError(400, "invalid_request", "no image: send a user content part of type image_url with a data: URI")
            mx = req.get("max_tokens", req.get("max_completion_tokens"))
            prompt = "\n".join(text) if text else None
            job = self._job(image, None if prompt else prompts.DEFAULT_TASK, prompt, "zh", mx, req.get("stream", False))
            job.chat_model = str(req.get("model") or "hunyuanocr")
            return job, True

        # -------------------------------------------------------------- streaming
        def _stream(self, job: Job, chat: bool) -> tuple[int, int]:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if chat else "application/x-ndjson")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.status = 200
            created = int(time.time())
            n = 0
            while True:
                ev = job.events.get(timeout=cfg.deadline_s + 10)
                if ev is None:
                    break
                tok, delta = ev
                n += 1
                if chat:
                    chunk = {"id": f"chatcmpl-{job.id}", "object": "chat.completion.chunk", "created": created,
                             "model": job.chat_model, "choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}]}
                    self.wfile.write(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")
                else:
                    self.wfile.write(json.dumps({"token": tok, "text": delta}, ensure_ascii=False).encode() + b"\n")
                self.wfile.flush()
            if job.error:
                err = json.loads(_error_body(job.error))
                self.wfile.write((b"data: " if chat else b"") + json.dumps(err).encode() + (b"\n\n" if chat else b"\n"))
                return n, 0
            r = job.result
            if chat:
                chunk = {"id": f"chatcmpl-{job.id}", "object": "chat.completion.chunk", "created": created,
                         "model": job.chat_model, "choices": [{"index": 0, "delta": {}, "finish_reason": _oai_finish(r.finish_reason)}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
            else:
                self.wfile.write(json.dumps(dict(r.to_dict(), id=job.id, done=True), ensure_ascii=False).encode() + b"\n")
            return r.generated_tokens, r.prompt_tokens

    return Handler


def _oai_finish(reason: str) -> str:
    return "stop" if reason in ("stop", "repetition") else "length"


def _chat_response(job: Job, r) -> dict:
    return {"id": f"chatcmpl-{job.id}", "object": "chat.completion", "created": int(time.time()),
            "model": job.chat_model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                         "finish_reason": _oai_finish(r.finish_reason)}],
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.generated_tokens,
                      "total_tokens": r.prompt_tokens + r.generated_tokens},
            "edgeocr": {"lines": r.to_dict()["lines"], "timings_ms": r.to_dict()["timings_ms"],
                        "finish_reason": r.finish_reason}}


def serve(cfg: ServerConfig) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    daemon = Daemon(cfg)
    signals = {"n": 0}

    def on_signal(signum, frame):
        signals["n"] += 1
        if signals["n"] > 1:
            log.warning("second signal: exiting now")
            os._exit(130)
        daemon.begin_drain()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    daemon.start()
    while not daemon.shutdown.is_set():
        if daemon.engine.stopped.is_set() and daemon.engine.load_error:
            daemon.close()
            return 1
        daemon.shutdown.wait(0.2)
    daemon.close()
    log.info("stopped")
    return 0


def client_request(address: str, method: str, path: str, body: bytes | None = None,
                   headers: dict | None = None, timeout: float = 300.0) -> tuple[int, bytes]:
    """Minimal client for `unix:/path/to.sock` or `http://host:port` daemons."""
    import http.client

    if address.startswith("unix:"):
        sock_path = address[5:].lstrip("/") if address.startswith("unix://") else address[5:]
        sock_path = "/" + sock_path.lstrip("/")

        class UnixConn(http.client.HTTPConnection):
            def connect(self):
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(sock_path)

        conn = UnixConn("localhost", timeout=timeout)
    else:
        from urllib.parse import urlparse
        u = urlparse(address)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
