"""The HTTP application: a plain ASGI callable served by uvicorn.

Handlers never touch the model: they check the caller (Host, Origin, API key on TCP), reserve a queue
place before reading the body, read the body against a byte cap and a deadline, parse it into a job,
and wait for the engine's events — watching the connection the whole time, so a client that leaves
marks its job gone and the engine drops or cancels it.  Every failure is a JSON error reply and one
log line; nothing raised here reaches uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from edgeocr.decode import DecodeOptions
from edgeocr.serve import parsing
from edgeocr.serve.engine import PageRequest
from edgeocr.serve.errors import HTTPError
from edgeocr.serve.jobs import DONE, ERROR, GONE, TOKEN, Job
from edgeocr.serve.protocol import MAX_HEADER_BYTES

log = logging.getLogger("edgeocr.serve")

MODEL_ID = "hunyuanocr"                     # the model name /v1/models lists
PUBLIC = frozenset({"/health/live", "/health/ready", "/", "/sample.png", "/openapi.json"})   # no key on TCP
GET_ROUTES = ("/health/live", "/health/ready", "/v1/info", "/v1/models", "/metrics", "/", "/sample.png",
              "/openapi.json")
POST_ROUTES = ("/v1/ocr", "/v1/chat/completions")
ENDPOINTS = GET_ROUTES + POST_ROUTES + ("/v1/models/{id}",)
PARSE_IN_THREAD_BYTES = 256 * 1024          # bodies above this are parsed off the event loop
SINGLE_HEADERS = ("host", "authorization", "content-type", "content-length", "origin")
API_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
               (b"cache-control", b"no-store")]


class ClientGone(Exception):
    """The client disconnected; there is nobody to answer."""


class Exchange:
    """One request and its reply, plus what its log line reports."""

    def __init__(self, scope, receive, send):
        self.scope, self.receive, self._send = scope, receive, send
        self.method = scope.get("method", "")
        self.path = scope.get("path", "")
        self.rid = uuid.uuid4().hex[:12]
        self.t0 = time.monotonic()
        self.is_tcp = scope.get("client") is not None
        self.status = 0                      # HTTP status sent (0: none)
        self.tokens = self.prompt_tokens = 0
        self.wait_ms = 0.0                   # time queued before the engine took it (admission not included)
        self.note = ""                       # extra log detail (an error after a stream started)
        self.headers: dict[str, str] = {}
        self.duplicate: str | None = None    # a header that must appear once but came twice
        for k, v in scope.get("headers", []):
            name = k.decode("latin-1").lower()
            if name in self.headers and name in SINGLE_HEADERS:
                self.duplicate = name
            self.headers[name] = v.decode("latin-1")
        self.head_bytes = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) + sum(
            len(k) + len(v) + 4 for k, v in scope.get("headers", []))
        self.has_body = self.headers.get("content-length", "0") != "0" or "transfer-encoding" in self.headers
        self.body_read = False               # the whole body has been received

    @property
    def started(self) -> bool:
        return self.status != 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        await self._send({"type": "http.response.start", "status": status,
                          "headers": headers + [(b"x-request-id", self.rid.encode())]})

    async def body(self, data: bytes, more: bool = False) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def reply(self, status: int, data: bytes, ctype: str = "application/json", headers: dict | None = None,
                    close: bool = False) -> None:
        extra = {k.lower().encode("latin-1"): str(v).encode("latin-1") for k, v in (headers or {}).items()}
        h = [(b"content-type", ctype.encode()), (b"content-length", str(len(data)).encode())]
        h += [(k, v) for k, v in API_HEADERS if k not in extra] + list(extra.items())
        if close:
            h.append((b"connection", b"close"))
        await self.start(status, h)
        await self.body(data)

    async def json(self, status: int, obj, headers: dict | None = None) -> None:
        await self.reply(status, json.dumps(obj, ensure_ascii=False).encode(), headers=headers)

    async def error(self, e: HTTPError) -> None:
        # a body left unread would otherwise keep arriving on this connection: reply, then close
        await self.reply(e.status, e.body(), headers=e.headers, close=e.close or (self.has_body and not self.body_read))

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        """The whole body, refused as soon as it passes `limit` bytes or `timeout_s` seconds, whatever
        Content-Length says (h11 has already refused an invalid or negative one)."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, "payload_too_large", f"body of {declared} bytes exceeds the limit of {limit}",
                            close=True)
        deadline = time.monotonic() + timeout_s
        chunks, n = [], 0
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                msg = await asyncio.wait_for(self.receive(), left)
            except asyncio.TimeoutError:
                raise HTTPError(408, "request_timeout", f"body not received within {timeout_s:g} s",
                                close=True) from None
            if msg["type"] == "http.disconnect":
                raise ClientGone
            chunk = msg.get("body", b"")
            n += len(chunk)
            if n > limit:
                raise HTTPError(413, "payload_too_large", f"body exceeds the limit of {limit} bytes", close=True)
            chunks.append(chunk)
            if not msg.get("more_body", False):
                self.body_read = True
                return b"".join(chunks)


class App:
    """ASGI entry point.  `daemon` provides cfg, admission, worker, metrics, api_key, allowed_hosts."""

    def __init__(self, daemon):
        self.d = daemon
        self.cfg = daemon.cfg
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="edgeocr-parse")
        self._key_digest = hashlib.sha256(daemon.api_key.encode()).digest() if daemon.api_key else None
        self.active = 0                      # requests being handled now

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":          # lifespan is off; websockets are not served
            return
        rx = Exchange(scope, receive, send)
        self.active += 1
        try:
            await self._handle(rx)
        except ClientGone:
            rx.note = "client left"
        except HTTPError as e:
            await self._try_error(rx, e)
        except asyncio.CancelledError:        # the server cut this request short at shutdown: still a reply
            rx.note = "cut at shutdown"
            with contextlib.suppress(Exception):
                if rx.started:
                    await rx.body(b"")
                else:
                    await rx.error(HTTPError(503, "shutting_down", "the server shut down before this request "
                                                                   "finished", {"Retry-After": "5"}, close=True))
        except Exception:
            log.exception("%s %s %s: internal error", rx.rid, rx.method, _clean(rx.path))
            await self._try_error(rx, HTTPError(500, "internal_error",
                                                f"internal error; request id {rx.rid} is in the daemon log",
                                                close=True))
        finally:
            self.active -= 1
            self._log(rx)

    async def _try_error(self, rx: Exchange, e: HTTPError) -> None:
        if rx.started:
            rx.note = rx.note or e.type
            return
        await rx.error(e)

    def _log(self, rx: Exchange) -> None:
        dt = time.monotonic() - rx.t0
        status = rx.status or 499
        endpoint = "/v1/models/{id}" if rx.path.startswith("/v1/models/") else rx.path
        self.d.metrics.request(endpoint, status, dt)
        log.info("%s %s %s %d %.0fms tokens=%d queue_wait=%.0fms%s", rx.rid, _clean(rx.method, 16),
                 _clean(rx.path), status, dt * 1e3, rx.tokens, rx.wait_ms, f" ({rx.note})" if rx.note else "")

    # ------------------------------------------------------------------ dispatch
    async def _handle(self, rx: Exchange) -> None:
        path = rx.path
        known = path in GET_ROUTES or path in POST_ROUTES or path.startswith("/v1/models/")
        if rx.head_bytes > MAX_HEADER_BYTES:
            raise HTTPError(431, "headers_too_large", f"request line and headers are {rx.head_bytes} bytes; "
                                                      f"the limit is {MAX_HEADER_BYTES}")
        if rx.duplicate:
            raise HTTPError(400, "invalid_request", f"header {rx.duplicate!r} given more than once")
        self._guard(rx, public=path in PUBLIC)
        if not known:
            raise HTTPError(404, "not_found", f"no route {_clean(path)}")
        if path in POST_ROUTES:
            if rx.method != "POST":
                raise HTTPError(405, "method_not_allowed", f"{path} takes POST", {"Allow": "POST"})
            return await self._ocr(rx, chat=path == "/v1/chat/completions")
        if rx.method not in ("GET", "HEAD"):
            raise HTTPError(405, "method_not_allowed", f"{path} takes GET", {"Allow": "GET, HEAD"})
        if path.startswith("/v1/models/"):
            return await self._model(rx, path[len("/v1/models/"):])
        handlers = {"/health/live": self._get_live, "/health/ready": self._get_ready, "/v1/info": self._get_info,
                    "/v1/models": self._get_models, "/metrics": self._get_metrics, "/": self._get_page,
                    "/sample.png": self._get_sample, "/openapi.json": self._get_openapi}
        await handlers[path](rx)

    def _guard(self, rx: Exchange, public: bool) -> None:
        """TCP only (the Unix socket is guarded by its file permissions): Host, Origin, then the API key."""
        if not rx.is_tcp:
            return
        raw = rx.headers.get("host", "")
        try:
            name, _ = parsing.parse_host(raw)
        except ValueError as e:
            raise HTTPError(403, "forbidden_host", f"Host header {_clean(raw, 100)!r} is not a host with an "
                                                   f"optional port ({e})") from None
        if name not in self.d.allowed_hosts:
            raise HTTPError(403, "forbidden_host", f"Host header {_clean(raw, 100)!r} is not allowed")
        host = raw.lower()
        origin = rx.headers.get("origin")
        if origin is not None and origin.lower() not in (f"http://{host}", f"https://{host}"):
            raise HTTPError(403, "forbidden_origin", f"cross-origin request from {_clean(origin, 100)!r} refused")
        if self._key_digest is not None and not public:
            auth = rx.headers.get("authorization", "")
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(hashlib.sha256(given.encode("utf-8", "replace")).digest(), self._key_digest):
                raise HTTPError(401, "unauthorized", "missing or wrong API key (Authorization: Bearer KEY)",
                                {"WWW-Authenticate": "Bearer"})

    # ------------------------------------------------------------------ GET
    async def _get_live(self, rx):
        await rx.json(200, {"status": "live"})

    async def _get_ready(self, rx):
        w, adm = self.d.worker, self.d.admission
        if w.phase == "failed":
            raise HTTPError(503, "load_failed", w.error or "the engine failed")
        if adm.state == "draining":
            raise HTTPError(503, "shutting_down", "draining", {"Retry-After": "5"})
        if w.phase != "ready":
            raise HTTPError(503, "not_ready", f"{w.phase}", {"Retry-After": "2"})
        await rx.json(200, {"status": "ready", "queue_depth": adm.depth(), "slots": adm.slots,
                            "slots_busy": adm.slots_busy(), "in_engine": adm.in_engine()})

    async def _get_info(self, rx):
        w, cfg = self.d.worker, self.cfg
        if not w.info:
            raise HTTPError(503, "not_ready", "loading", {"Retry-After": "2"})
        limits = {k: getattr(cfg, k) for k in ("queue_size", "max_body_bytes", "max_pixels", "max_new_tokens",
                                               "default_max_new_tokens", "deadline_s", "header_timeout_s",
                                               "body_timeout_s", "keep_alive_s", "send_timeout_s",
                                               "max_connections")}
        await rx.json(200, dict(w.info, queue_size=cfg.queue_size, ready=w.phase == "ready",
                                slots=self.d.admission.slots, limits=limits))

    async def _get_models(self, rx):
        await rx.json(200, {"object": "list", "data": [self._model_card()]})

    async def _model(self, rx, model_id: str):
        if model_id != MODEL_ID:
            raise HTTPError(404, "model_not_found", f"no model {_clean(model_id, 100)!r}; this daemon serves "
                                                    f"{MODEL_ID!r}")
        await rx.json(200, self._model_card())

    def _model_card(self) -> dict:
        return {"id": MODEL_ID, "object": "model", "created": int(self.d.started_at), "owned_by": "edgeocr"}

    async def _get_metrics(self, rx):
        if not self.cfg.metrics:
            raise HTTPError(404, "not_found", "metrics are off (metrics = true turns them on)")
        data, ctype = self.d.metrics.render()
        await rx.reply(200, data, ctype)

    async def _get_page(self, rx):
        from edgeocr.webpage import PAGE, SECURITY_HEADERS
        await rx.reply(200, PAGE.encode(), "text/html; charset=utf-8", SECURITY_HEADERS)

    async def _get_sample(self, rx):
        from edgeocr.webpage import sample_png
        await rx.reply(200, sample_png(), "image/png")

    async def _get_openapi(self, rx):
        from edgeocr.serve.openapi import openapi
        await rx.json(200, openapi(self.cfg))

    # ------------------------------------------------------------------ POST /v1/ocr, /v1/chat/completions
    async def _ocr(self, rx: Exchange, chat: bool) -> None:
        ctype = rx.headers.get("content-type", "").strip().lower()
        media = parsing.header_params(ctype)[0]          # the media type alone, its parameters aside
        multipart = media == "multipart/form-data"
        if not (media in ("application/json", "") or (multipart and not chat)):
            kinds = "application/json" if chat else "multipart/form-data or application/json"
            raise HTTPError(415, "unsupported_media_type", f"Content-Type {_clean(ctype, 100)!r}; use {kinds}")
        ticket = self.d.admission.reserve()          # before a byte of the body is read
        try:
            body = await rx.read_body(self.cfg.max_body_bytes, self.cfg.body_timeout_s)
            params = await self._parse(body, rx.headers.get("content-type", ""), chat, multipart)
            del body
            job = Job(id=rx.rid, request=PageRequest(params.image, params.task, params.prompt, params.lang,
                                                     DecodeOptions(max_new_tokens=params.max_new_tokens)),
                      stream=params.stream, deadline=time.monotonic() + self.cfg.deadline_s,
                      loop=asyncio.get_running_loop(), chat_model=params.chat_model)
            self.d.admission.submit(ticket, job)
        finally:
            ticket.release()
        watcher = asyncio.ensure_future(self._watch(rx, job))
        try:
            if params.stream:
                await self._stream(rx, job, params, chat)
            else:
                await self._whole(rx, job, chat)
        finally:
            watcher.cancel()
            job.gone = True           # finished: no effect; left early (disconnect, shutdown): dropped or cancelled
            self.d.admission.wake()

    async def _parse(self, body: bytes, ctype: str, chat: bool, multipart: bool) -> parsing.OCRParams:
        if chat:
            fn, args = parsing.chat_params, (body, self.cfg)
        elif multipart:
            fn, args = parsing.ocr_from_multipart, (body, ctype, self.cfg)
        else:
            fn, args = parsing.ocr_from_json, (body, self.cfg)
        if len(body) <= PARSE_IN_THREAD_BYTES:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _watch(self, rx: Exchange, job: Job) -> None:
        """Wait for the connection to drop; then the engine drops or cancels the job within one step."""
        while True:
            msg = await rx.receive()
            if msg["type"] == "http.disconnect":
                job.gone = True
                job.events.put_nowait((GONE,))
                self.d.admission.wake()
                return

    async def _next(self, job: Job) -> tuple:
        left = job.deadline - time.monotonic() + 30.0      # the engine enforces the deadline; this is a backstop
        try:
            return await asyncio.wait_for(job.events.get(), max(1.0, left))
        except asyncio.TimeoutError:
            raise HTTPError(504, "deadline_exceeded", "no result from the engine before the deadline") from None

    async def _whole(self, rx: Exchange, job: Job, chat: bool) -> None:
        while True:
            item = await self._next(job)
            if item[0] == DONE:
                break
            if item[0] == ERROR:
                raise item[1]
            if item[0] == GONE:
                raise ClientGone
        r = item[1]
        rx.tokens, rx.prompt_tokens = r.generated_tokens, r.prompt_tokens
        rx.wait_ms = (job.taken - job.enqueued) * 1e3
        await rx.json(200, chat_response(job, r) if chat else dict(r.to_dict(), id=job.id))

    async def _stream(self, rx: Exchange, job: Job, params: parsing.OCRParams, chat: bool) -> None:
        item = await self._next(job)                 # the status waits for admission: a bad image is a 4xx
        if item[0] == ERROR:
            raise item[1]
        if item[0] == GONE:
            raise ClientGone
        rx.wait_ms = (job.taken - job.enqueued) * 1e3
        ctype = b"text/event-stream" if chat else b"application/x-ndjson"
        await rx.start(200, [(b"content-type", ctype), (b"cache-control", b"no-cache"),
                             (b"x-content-type-options", b"nosniff")])
        enc = SSE(job, params) if chat else NDJSON(job)
        out = [enc.opening()]
        while True:
            kind = item[0]
            if kind == TOKEN:
                rx.tokens += 1
                out.append(enc.token(item[1], item[2]))
            elif kind == DONE:
                rx.tokens, rx.prompt_tokens = item[1].generated_tokens, item[1].prompt_tokens
                out.append(enc.done(item[1]))
                await rx.body(b"".join(out))
                return
            elif kind == ERROR:
                rx.note = item[1].type
                out.append(enc.error(item[1]))
                await rx.body(b"".join(out))
                return
            else:
                raise ClientGone
            if job.events.empty():
                await rx.body(b"".join(out), more=True)
                out = []
                item = await self._next(job)
            else:
                item = job.events.get_nowait()


# ---------------------------------------------------------------------- reply formats
class NDJSON:
    """/v1/ocr stream: {"token", "text"} per token, then the full result with "done": true."""

    def __init__(self, job: Job):
        self.job = job

    def opening(self) -> bytes:
        return b""

    def token(self, tok: int, delta: str) -> bytes:
        return json.dumps({"token": tok, "text": delta}, ensure_ascii=False).encode() + b"\n"

    def done(self, r) -> bytes:
        return json.dumps(dict(r.to_dict(), id=self.job.id, done=True), ensure_ascii=False).encode() + b"\n"

    def error(self, e: HTTPError) -> bytes:
        return json.dumps(e.as_dict()).encode() + b"\n"


class SSE:
    """OpenAI chat.completion.chunk events, then data: [DONE]."""

    def __init__(self, job: Job, params: parsing.OCRParams):
        self.job, self.params = job, params
        self.created = int(time.time())

    def _chunk(self, delta: dict, finish: str | None = None, **extra) -> bytes:
        c = {"id": f"chatcmpl-{self.job.id}", "object": "chat.completion.chunk", "created": self.created,
             "model": self.job.chat_model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        c.update(extra)
        return b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n"

    def opening(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def token(self, tok: int, delta: str) -> bytes:
        return self._chunk({"content": delta}) if delta else b""

    def done(self, r) -> bytes:
        out = self._chunk({}, oai_finish(r.finish_reason))
        if self.params.include_usage:
            c = {"id": f"chatcmpl-{self.job.id}", "object": "chat.completion.chunk", "created": self.created,
                 "model": self.job.chat_model, "choices": [], "usage": usage(r)}
            out += b"data: " + json.dumps(c).encode() + b"\n\n"
        return out + b"data: [DONE]\n\n"

    def error(self, e: HTTPError) -> bytes:
        return b"data: " + json.dumps(e.as_dict()).encode() + b"\n\n"


def oai_finish(reason: str) -> str:
    return "stop" if reason in ("stop", "repetition") else "length"


def usage(r) -> dict:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.generated_tokens,
            "total_tokens": r.prompt_tokens + r.generated_tokens}


def chat_response(job: Job, r) -> dict:
    d = r.to_dict()
    return {"id": f"chatcmpl-{job.id}", "object": "chat.completion", "created": int(time.time()),
            "model": job.chat_model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                         "finish_reason": oai_finish(r.finish_reason)}],
            "usage": usage(r),
            "edgeocr": {"lines": d["lines"], "timings_ms": d["timings_ms"], "finish_reason": r.finish_reason}}


def _clean(s: str, n: int = 200) -> str:
    """Client-supplied text made safe for one log line: escapes, no newlines, bounded length."""
    s = s.encode("unicode_escape", "backslashreplace").decode("ascii", "replace")
    return s if len(s) <= n else s[:n] + "..."
