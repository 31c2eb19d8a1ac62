"""Request bodies -> validated OCR parameters.  Pure functions: every malformed, oversized or
mistyped field becomes a 400/413 HTTPError that names the field; nothing here decodes an image
(the image header is read for its size, the pixels are decoded by the engine once admitted)."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from dataclasses import dataclass

from edgeocr import preprocess, prompts
from edgeocr.errors import ImageError, ImageTooLarge
from edgeocr.serve.errors import HTTPError, bad_request

OCR_FIELDS = frozenset({"image", "task", "prompt", "lang", "max_new_tokens", "stream"})
MAX_MULTIPART_PARTS = 16              # form fields + the image
MAX_PART_HEADER_BYTES = 8 * 1024      # headers of one multipart part
MAX_CHAT_MESSAGES = 256               # entries in an OpenAI messages list
MAX_TEXT_FIELD_BYTES = 64 * 1024      # a multipart text field (prompt, task...)
MAX_JSON_CONTAINERS = 4096            # objects + arrays in a JSON body, counted before parsing (a chat request
                                      # with 256 messages of a few parts each has about 1,000)

# `type; key=token; key="quoted \" string"` (RFC 9110 parameters), matched from a position: linear time
_HEADER_PARAM = re.compile(r'[ \t]*;[ \t]*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)[ \t]*=[ \t]*'
                           r'(?:"((?:[^"\\\r\n]|\\.)*)"|([^;"\s]+))[ \t]*')
_QUOTED_PAIR = re.compile(r"\\(.)")
_ASCII_SPACE = str.maketrans("", "", " \t\r\n")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')      # a JSON string, escapes included (linear)


@dataclass(frozen=True)
class OCRParams:
    image: preprocess.ImageBytes       # encoded image (PNG, JPEG, ...) and the pixel limit; header checked
    task: str | None                   # official task key, or None with a custom prompt
    prompt: str | None                 # custom instruction
    lang: str                          # zh | en
    max_new_tokens: int                # already within the server's cap
    stream: bool                       # NDJSON / SSE token stream
    image_size: tuple[int, int]        # (width, height) from the image header
    chat_model: str = "hunyuanocr"     # OpenAI requests: model name echoed back
    include_usage: bool = False        # OpenAI stream_options.include_usage


# ---------------------------------------------------------------------- primitives
def parse_json(body: bytes) -> dict:
    """A JSON object, or 400 invalid_json for anything else (bad UTF-8, deep nesting, huge numbers, more than
    MAX_JSON_CONTAINERS objects and arrays: a 20 MiB body of empty objects would take ~25x its size to parse)."""
    containers = body.count(b"{") + body.count(b"[")     # an upper bound (brackets inside strings count too)
    if containers > MAX_JSON_CONTAINERS:                 # count again without the strings' contents
        bare = _JSON_STRING.sub(b'""', body)
        containers = bare.count(b"{") + bare.count(b"[")
    if containers > MAX_JSON_CONTAINERS:
        raise bad_request(f"body is not acceptable JSON: {containers} objects and arrays (at most "
                          f"{MAX_JSON_CONTAINERS}; the image goes in as one base64 string)", "invalid_json")
    try:
        obj = json.loads(body)
    except RecursionError:
        raise bad_request("body is not acceptable JSON: nested too deeply", "invalid_json") from None
    except UnicodeDecodeError:
        raise bad_request("body is not valid UTF-8 JSON", "invalid_json") from None
    except ValueError as e:       # JSONDecodeError, and int() refusing a number with thousands of digits
        raise bad_request(f"body is not valid JSON: {_short(str(e))}", "invalid_json") from None
    if not isinstance(obj, dict):
        raise bad_request(f"body must be a JSON object, got {_json_type(obj)}")
    return obj


def text(value, name: str, *, allow_empty: bool = False) -> str:
    """A string that is valid Unicode (no lone surrogates), else 400 naming the field."""
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string, got {_json_type(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"'{name}' is not valid Unicode (lone surrogate)") from None
    if not allow_empty and not value.strip():
        raise bad_request(f"'{name}' must be a non-empty string")
    return value


def integer(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {_json_type(value)}")
    return value


def boolean(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {_json_type(value)}")
    return value


def image_field(s, name: str = "image") -> bytes:
    """A base64 string or a base64 data: URI -> bytes.  URLs are never fetched."""
    if not isinstance(s, str) or not s:
        raise bad_request(f"'{name}' must be a base64 string or a data: URI"
                          + ("" if isinstance(s, str) else f", got {_json_type(s)}"))
    if s.startswith("data:"):
        head, sep, s = s.partition(",")
        if not sep or ";base64" not in head:
            raise bad_request(f"'{name}': data URI must be base64-encoded (data:image/png;base64,...)")
    elif s.startswith(("http://", "https://", "file:", "ftp:")):
        raise bad_request(f"'{name}': image URLs are not fetched; send the image as base64 or a data: URI")
    s = s.translate(_ASCII_SPACE)                    # `base64 FILE` wraps its output at 76 columns
    if ("-" in s or "_" in s) and not ("+" in s or "/" in s):       # the URL-safe alphabet
        s = s.replace("-", "+").replace("_", "/")
    if len(s) % 4 in (2, 3):                         # padding left out (URL-safe and "raw" encoders)
        s += "=" * (-len(s) % 4)
    try:
        data = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"'{name}' is not valid base64 ({_short(str(e), 120)})") from None
    if not data:
        raise bad_request(f"'{name}' is empty")
    return data


def probe_image(data: bytes, max_pixels: int) -> tuple[int, int]:
    """Read the image header only: format, size against `max_pixels`, minimum page edge, aspect ratio
    (edgeocr.preprocess.open_image: the same checks and messages as a local run)."""
    if data[:5] == b"%PDF-":
        raise HTTPError(400, "invalid_image", "image: a PDF; the daemon reads images only (render its pages to "
                                              "PNG or JPEG first, or use `edgeocr run --remote`, which renders "
                                              "PDF pages on the client)")
    try:
        return preprocess.open_image(data, "image", max_pixels).size
    except ImageTooLarge as e:
        raise HTTPError(413, "invalid_image", str(e)) from None
    except ImageError as e:
        raise HTTPError(400, "invalid_image", str(e)) from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise HTTPError(400, "invalid_image", f"image: unreadable header ({_short(str(e))})") from None


# ---------------------------------------------------------------------- /v1/ocr
def ocr_params(image: bytes, task, prompt, lang, max_new, stream, cfg, max_name: str = "max_new_tokens") -> OCRParams:
    """Validated parameters; `max_name` is the name the client gave the token limit (errors use it)."""
    if task is not None:
        task = text(task, "task")
        if task not in prompts.TASKS_ZH:
            raise bad_request(f"unknown task {_short(task)!r}; one of {', '.join(prompts.task_names())}")
    if prompt is not None:
        prompt = text(prompt, "prompt")
    if task is not None and prompt is not None:
        raise bad_request("give either 'task' or 'prompt', not both")
    lang = text(lang, "lang")
    if lang not in ("zh", "en"):
        raise bad_request(f"'lang' must be 'zh' or 'en', got {_short(lang)!r}")
    if task and lang == "en" and task not in prompts.TASKS_EN:
        raise bad_request(f"task {task!r} has no English prompt")
    max_new = cfg.default_max_new_tokens if max_new is None else integer(max_new, max_name)
    if max_new < 1:
        raise bad_request(f"'{max_name}' must be a positive integer, got {max_new}")
    if max_new > cfg.max_new_tokens:
        raise bad_request(f"'{max_name}' {max_new} exceeds the cap {cfg.max_new_tokens}")
    size = probe_image(image, cfg.max_pixels)
    return OCRParams(preprocess.ImageBytes(image, cfg.max_pixels), task, prompt, lang, max_new, boolean(stream, "stream"), size)


def ocr_from_json(body: bytes, cfg) -> OCRParams:
    req = parse_json(body)
    unknown = set(req) - OCR_FIELDS
    if unknown:
        raise bad_request(f"unknown field(s) {sorted(_short(k, 40) for k in unknown)}; "
                          f"allowed: {', '.join(sorted(OCR_FIELDS))}")
    if "image" not in req:
        raise bad_request("'image' is required (base64 or a data: URI)")
    return ocr_params(image_field(req["image"]), req.get("task"), req.get("prompt"), req.get("lang", "zh"),
                      req.get("max_new_tokens"), req.get("stream", False), cfg)


def ocr_from_multipart(body: bytes, content_type: str, cfg) -> OCRParams:
    fields, files = parse_multipart(body, content_type)
    sent = sorted(_short(k, 40) for k in set(fields) | set(files))
    image = files.get("image", fields.get("image"))
    if image is None:
        raise bad_request(f"multipart body has no 'image' file field (fields sent: {sent})")
    unknown = (set(fields) | set(files)) - OCR_FIELDS
    if unknown:
        raise bad_request(f"unknown form field(s) {sorted(_short(k, 40) for k in unknown)}; "
                          f"allowed: {', '.join(sorted(OCR_FIELDS))}")
    if isinstance(image, str):
        image = image.encode("utf-8", "surrogateescape")
    if not image:
        raise bad_request("'image' is empty")
    mx = fields.get("max_new_tokens") or None
    if mx is not None:
        if not (mx.strip().isascii() and mx.strip().isdigit() and len(mx.strip()) <= 9):
            raise bad_request(f"'max_new_tokens' must be a positive integer, got {_short(mx)!r}")
        mx = int(mx)
    stream = fields.get("stream", "").strip().lower()
    if stream not in ("", "0", "1", "true", "false", "yes", "no"):
        raise bad_request(f"'stream' must be true or false, got {_short(stream)!r}")
    return ocr_params(image, fields.get("task") or None, fields.get("prompt") or None, fields.get("lang") or "zh",
                      mx, stream in ("1", "true", "yes"), cfg)


def parse_multipart(body: bytes, content_type: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """multipart/form-data -> (text fields, file fields).  Strict and linear-time: bytes.find only."""
    boundary = header_params(content_type)[1].get("boundary")
    if boundary is None or not 1 <= len(boundary) <= 70:
        raise bad_request("multipart Content-Type needs a boundary of 1 to 70 characters")
    delim = b"--" + boundary.encode("latin-1", "replace")
    start = body.find(delim)
    if start < 0 or (start > 0 and body[start - 2:start] != b"\r\n"):
        raise bad_request("malformed multipart body: no opening boundary")
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    pos = start + len(delim)
    for _ in range(MAX_MULTIPART_PARTS + 1):
        if body[pos:pos + 2] == b"--":
            return fields, files
        if body[pos:pos + 2] != b"\r\n":
            raise bad_request("malformed multipart body: bad boundary line")
        head_end = body.find(b"\r\n\r\n", pos + 2, pos + 2 + MAX_PART_HEADER_BYTES)
        if head_end < 0:
            raise bad_request("malformed multipart body: part headers missing or over "
                              f"{MAX_PART_HEADER_BYTES} bytes")
        end = body.find(b"\r\n" + delim, head_end + 4)
        if end < 0:
            raise bad_request("malformed multipart body: no closing boundary")
        name, filename = _part_name(body[pos + 2:head_end])
        data = body[head_end + 4:end]
        if name in fields or name in files:
            raise bad_request(f"multipart field {_short(name, 40)!r} given twice")
        if filename is not None or name == "image":
            files[name] = data
        else:
            if len(data) > MAX_TEXT_FIELD_BYTES:
                raise HTTPError(413, "payload_too_large", f"form field {_short(name, 40)!r} is over "
                                                          f"{MAX_TEXT_FIELD_BYTES} bytes")
            try:
                fields[name] = data.decode("utf-8")
            except UnicodeDecodeError:
                raise bad_request(f"form field {_short(name, 40)!r} is not UTF-8") from None
        pos = end + 2 + len(delim)
    raise bad_request(f"multipart body has more than {MAX_MULTIPART_PARTS} parts")


def _part_name(raw_headers: bytes) -> tuple[str, str | None]:
    params: dict[str, str] = {}
    for line in raw_headers.decode("utf-8", "replace").split("\r\n"):
        k, sep, v = line.partition(":")
        if sep and k.strip().lower() == "content-disposition":
            params = header_params(v)[1]
    name = params.get("name")
    if not name:
        raise bad_request("multipart part without a Content-Disposition name")
    return name, params.get("filename")


def header_params(value: str) -> tuple[str, dict[str, str]]:
    """`type; key=value; key="quoted"` -> (type lowercased, {key lowercased: value}); the first of a repeated key
    wins, and a parameter that does not parse (no value, an unterminated quote, a space in an unquoted value) is
    skipped up to the next `;`, as lenient parsers do.  Linear in the header's length (the standard library's
    email.message parameter parsing is quadratic in some inputs: 16 part headers of 8 KiB took seconds)."""
    pos = value.find(";")
    pos = len(value) if pos < 0 else pos
    main, params = value[:pos].strip(" \t").lower(), {}
    while pos < len(value):
        p = _HEADER_PARAM.match(value, pos)
        if p is None:
            nxt = value.find(";", pos + 1)
            if nxt < 0:
                break
            pos = nxt
            continue
        quoted = p.group(2)
        params.setdefault(p.group(1).lower(), _QUOTED_PAIR.sub(r"\1", quoted) if quoted is not None else p.group(3))
        pos = p.end()
    return main, params


# ---------------------------------------------------------------------- /v1/chat/completions
def chat_params(body: bytes, cfg) -> OCRParams:
    """OpenAI chat request -> OCR parameters: one image (data URI) in a user message, optional text."""
    req = parse_json(body)
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list")
    if len(msgs) > MAX_CHAT_MESSAGES:
        raise bad_request(f"'messages' has {len(msgs)} entries; at most {MAX_CHAT_MESSAGES}")
    image, texts = None, []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object, got {_json_type(m)}")
        role = text(m.get("role"), f"messages[{i}].role")
        content = m.get("content")
        if role != "user":
            if content is not None and not isinstance(content, (str, list)):
                raise bad_request(f"messages[{i}].content must be a string or a list of parts")
            continue
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = content
        else:
            raise bad_request(f"messages[{i}].content must be a string or a list of content parts, "
                              f"got {_json_type(content)}")
        for j, p in enumerate(parts):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(p, dict):
                raise bad_request(f"{where} must be an object, got {_json_type(p)}")
            kind = text(p.get("type"), f"{where}.type")
            if kind == "image_url":
                iu = p.get("image_url")
                url = iu.get("url") if isinstance(iu, dict) else iu
                if image is not None:
                    raise bad_request("one image per request: send one image_url part")
                image = image_field(url, f"{where}.image_url.url")
            elif kind == "text":
                t = text(p.get("text"), f"{where}.text", allow_empty=True)
                if t.strip():
                    texts.append(t)
            else:
                raise bad_request(f"{where}.type {_short(kind)!r} is not supported (text or image_url)")
    if image is None:
        raise bad_request("no image: send a user content part of type image_url with a data: URI")
    model = req.get("model", "hunyuanocr")
    model = text(model, "model") if model is not None else "hunyuanocr"
    max_name = "max_completion_tokens" if req.get("max_completion_tokens") is not None else "max_tokens"
    mx = req.get(max_name)
    n = req.get("n", 1)
    if n is not None and integer(n, "n") != 1:
        raise bad_request("'n' must be 1: one completion per request")
    stream = req.get("stream", False)
    stream = False if stream is None else boolean(stream, "stream")
    opts = req.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request(f"'stream_options' must be an object, got {_json_type(opts)}")
        include_usage = boolean(opts.get("include_usage", False), "stream_options.include_usage")
    prompt = "\n".join(texts) if texts else None
    p = ocr_params(image, None if prompt else prompts.DEFAULT_TASK, prompt, "zh", mx, stream, cfg, max_name)
    return OCRParams(p.image, p.task, p.prompt, p.lang, p.max_new_tokens, p.stream, p.image_size,
                     chat_model=model[:200], include_usage=include_usage)


# ---------------------------------------------------------------------- Host header
_REG_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")
_PORT = re.compile(r"[0-9]{1,5}")


def parse_host(value: str) -> tuple[str, int | None]:
    """A Host header -> (host, port or None), strictly (RFC 3986 `host [":" port]`): an IPv6 address only in
    brackets (returned as "[compressed form]", no zone id), an IPv4 address in dotted-quad form, or a DNS
    name of letters, digits, hyphens and dots whose last label does not start with a digit (lowercased); the port, when given, 1 to 5 ASCII digits up to
    65535.  Raises ValueError for anything else (whitespace, userinfo, paths, several colons, empty parts)."""
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            raise ValueError("unclosed '['")
        try:
            if "%" in value[1:close]:
                raise ValueError("zone id")
            ip = ipaddress.IPv6Address(value[1:close])
        except ValueError:
            raise ValueError("not an IPv6 address in brackets") from None
        host, rest = f"[{ip.compressed}]", value[close + 1:]
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
        host = host.lower()
        if not host.isascii() or not _REG_NAME.fullmatch(host):
            raise ValueError("not a host name or IPv4 address")
        if host.rsplit(".", 1)[-1][0].isdigit():      # a numeric last label: an IPv4 address or nothing
            try:                                      # (no 127.1, 0x7f.0.0.1, 127.0.0.01 forms)
                if str(ipaddress.IPv4Address(host)) != host:
                    raise ValueError
            except ValueError:
                raise ValueError("not a dotted-quad IPv4 address") from None
    if not rest:
        return host, None
    if rest[0] != ":" or not _PORT.fullmatch(rest[1:]) or int(rest[1:]) > 65535:
        raise ValueError("port must be 1 to 5 digits up to 65535")
    return host, int(rest[1:])


def allowed_host_names(spec: str) -> frozenset[str]:
    """The allowed_hosts setting (comma-separated) as the host names parse_host returns; a bare IPv6
    address is taken as its bracketed form."""
    out = set()
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        if item.count(":") > 1 and not item.startswith("["):
            item = f"[{item}]"
        try:
            host, port = parse_host(item)
        except ValueError as e:
            raise ValueError(f"allowed_hosts entry {item!r}: {e}") from None
        if port is not None:
            raise ValueError(f"allowed_hosts entry {item!r}: give host names without a port")
        out.add(host)
    return frozenset(out)


# ---------------------------------------------------------------------- helpers
def _json_type(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _short(s: str, n: int = 80) -> str:
    s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s if len(s) <= n else s[:n] + "..."
