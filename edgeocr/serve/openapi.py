"""OpenAPI 3.1 description of the daemon's API, served at /openapi.json."""

from __future__ import annotations

from edgeocr import __version__, prompts
from edgeocr.decode import FinishReason

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "type", "message"],
    "properties": {"code": {"type": "integer", "description": "HTTP status"},
                   "type": {"type": "string", "description": "stable slug: invalid_request, invalid_image, "
                            "invalid_json, payload_too_large, request_timeout, overloaded, not_ready, "
                            "shutting_down, deadline_exceeded, unauthorized, forbidden_host, ..."},
                   "message": {"type": "string", "description": "what is wrong, naming the field or limit"}}}}}


def _errors(*codes: int) -> dict:
    out = {}
    for c in codes:
        out[str(c)] = {"description": {400: "bad input", 401: "missing or wrong API key (TCP)",
                                       403: "Host or Origin not allowed (TCP)", 408: "body too slow",
                                       413: "body or image too large", 415: "unsupported Content-Type",
                                       503: "queue full, loading or shutting down (Retry-After)",
                                       504: "deadline passed"}[c],
                       "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return out


def openapi(cfg) -> dict:
    fields = {
        "task": {"type": "string", "enum": prompts.task_names(), "description": "official task (default: "
                 f"{prompts.DEFAULT_TASK}); or give prompt"},
        "prompt": {"type": "string", "description": "custom instruction instead of a task"},
        "lang": {"type": "string", "enum": ["zh", "en"], "default": "zh"},
        "max_new_tokens": {"type": "integer", "minimum": 1, "maximum": cfg.max_new_tokens,
                           "default": cfg.default_max_new_tokens},
        "stream": {"type": "boolean", "default": False, "description": "NDJSON: one {token, text} line per "
                   "token, then the result with done: true"},
    }
    result = {"type": "object", "properties": {
        "id": {"type": "string"}, "text": {"type": "string"},
        "finish_reason": {"type": "string", "enum": [r.value for r in FinishReason if r is not FinishReason.CANCELLED]},
        "task": {"type": ["string", "null"]},
        "lines": {"type": "array", "items": {"type": "object", "properties": {
            "text": {"type": "string"}, "box": {"type": "array", "items": {"type": "integer"}},
            "box_norm": {"type": "array", "items": {"type": "integer"}}}}},
        "prompt_tokens": {"type": "integer"}, "generated_tokens": {"type": "integer"},
        "image_size": {"type": "array", "items": {"type": "integer"}},
        "timings_ms": {"type": "object", "additionalProperties": {"type": "number"}}}}
    json_body = {"type": "object", "required": ["image"], "additionalProperties": False,
                 "properties": dict(image={"type": "string", "description": "base64 or a data: URI"}, **fields)}
    form_body = {"type": "object", "required": ["image"],
                 "properties": dict(image={"type": "string", "format": "binary"}, **fields)}
    refusals = _errors(400, 401, 403, 408, 413, 415, 503, 504)
    ocr = {"summary": "Read one image",
           "requestBody": {"required": True, "content": {"application/json": {"schema": json_body},
                                                         "multipart/form-data": {"schema": form_body}}},
           "responses": {"200": {"description": "the result (an NDJSON stream with stream: true)",
                                 "content": {"application/json": {"schema": result},
                                             "application/x-ndjson": {"schema": {"type": "string"}}}},
                         **refusals}}
    chat = {"summary": "OpenAI-compatible: one image_url (data URI) and optional text in a user message",
            "responses": {"200": {"description": "chat.completion, or SSE chunks with stream: true"}, **refusals}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "edgeocr daemon", "version": __version__,
                 "description": f"Body limit {cfg.max_body_bytes} bytes, image limit {cfg.max_pixels} pixels, "
                                f"deadline {cfg.deadline_s:g} s. Over TCP: Authorization: Bearer KEY."},
        "paths": {
            "/v1/ocr": {"post": ocr},
            "/v1/chat/completions": {"post": chat},
            "/v1/models": {"get": {"summary": "OpenAI-compatible model list",
                                   "responses": {"200": {"description": "the served model"}}}},
            "/v1/info": {"get": {"summary": "versions, artifact, limits",
                                 "responses": {"200": {"description": "info"}}}},
            "/health/live": {"get": {"summary": "the process answers", "responses": {"200": {"description": "live"}}}},
            "/health/ready": {"get": {"summary": "loaded, warmed up and not draining",
                                      "responses": {"200": {"description": "ready"}, **_errors(503)}}},
        },
        "components": {"schemas": {"Error": _ERROR},
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
