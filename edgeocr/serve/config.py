"""Daemon settings: command-line flags, then EDGEOCR_* environment variables, then a config file
(`key = value` lines, `#` comments), then defaults — in that order of precedence."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from pathlib import Path

from edgeocr.errors import EdgeOCRError
from edgeocr.preprocess import DEFAULT_MAX_PIXELS


class ConfigError(EdgeOCRError, ValueError):
    pass


@dataclass(frozen=True)
class ServerConfig:
    artifact: str = ""                               # artifact directory to serve
    socket: str = "/run/edgeocr/edgeocr.sock"        # Unix socket path ("" disables it)
    socket_mode: int = 0o660                         # permissions of the Unix socket
    tcp: str = ""                                    # loopback "HOST:PORT"[,...] ("" disables TCP); [::1]:PORT for IPv6
    api_key_file: str = ""                           # file holding the Bearer key required on TCP
    tcp_without_key: bool = False                    # allow TCP without api_key_file: no authentication at all
    allowed_hosts: str = "localhost,127.0.0.1,[::1],::1"  # Host header values accepted on TCP
    device: str = "cpu"                              # cpu | cuda
    threads: int = 0                                 # CPU threads for ONNX Runtime (0 = all cores)
    queue_size: int = 8                              # requests waiting beyond the running ones; full -> 503
    max_body_bytes: int = 20 * 1024 * 1024           # request body limit, bytes, counted as the body arrives
    max_pixels: int = DEFAULT_MAX_PIXELS             # image pixel limit, read from the header before decoding
    max_new_tokens: int = 4096                       # cap on a request's max_new_tokens
    default_max_new_tokens: int = 1024               # when a request gives none
    deadline_s: float = 120.0                        # per-request deadline, queueing included, seconds
    drain_s: float = 30.0                            # on SIGTERM/SIGHUP, time allowed for accepted work, seconds
    header_timeout_s: float = 10.0                   # time to send the request line and headers, seconds
    body_timeout_s: float = 30.0                     # time to send the whole body once the headers are in, seconds
    keep_alive_s: float = 5.0                        # idle time before a keep-alive connection is closed, seconds
    send_timeout_s: float = 30.0                     # a client that reads nothing of a reply for this long is dropped
    max_connections: int = 256                       # open client connections; beyond -> 503 and close
    backlog: int = 1024                              # listen backlog (capped by net.core.somaxconn)
    metrics: bool = False                            # serve Prometheus /metrics
    warmup: bool = True                              # run one image before reporting ready
    vision_ahead: bool = False                       # a page's vision on its own thread while the others decode
    log_level: str = "info"                          # debug | info | warning | error


_TYPES = {f.name: f.type for f in fields(ServerConfig)}
HELP = {
    "artifact": "artifact directory to serve", "socket": "Unix socket path ('' disables it)",
    "socket_mode": "Unix socket permissions, octal",
    "tcp": "also listen on HOST:PORT, loopback only; several separated by commas; [::1]:PORT for IPv6",
    "api_key_file": "file with the Bearer API key; required with tcp unless tcp_without_key",
    "tcp_without_key": "listen on TCP without an API key: no authentication (true/false; logged as a warning)",
    "allowed_hosts": "comma-separated Host headers accepted on TCP",
    "device": "cpu or cuda", "threads": "CPU threads (0 = all)", "queue_size": "waiting requests before 503",
    "max_body_bytes": "request body limit, bytes (no header can raise it)",
    "max_pixels": "image pixel limit (read from the image header, before decoding)",
    "max_new_tokens": "cap on max_new_tokens", "default_max_new_tokens": "max_new_tokens when a request gives none",
    "deadline_s": "per-request deadline, queueing included, seconds",
    "drain_s": "drain time on SIGTERM/SIGINT/SIGHUP, seconds",
    "header_timeout_s": "time a client has to send the request line and headers, seconds",
    "body_timeout_s": "time a client has to send the whole body, seconds",
    "keep_alive_s": "idle keep-alive connections are closed after this, seconds",
    "send_timeout_s": "a client that reads nothing of a reply for this long is dropped, seconds",
    "max_connections": "open client connections before new ones get 503",
    "backlog": "listen backlog (capped by net.core.somaxconn)",
    "metrics": "serve Prometheus /metrics (true/false)", "warmup": "warm up before ready (true/false)",
    "vision_ahead": "run each page's vision on its own thread while the other slots decode (true/false; "
                    "measured: no gain on the H200 with ONNX Runtime's step, 5 % more pages/s on an H100 with the "
                    "native step; docs/batching.md, docs/perf.md section 9)",
    "log_level": "debug, info, warning or error",
}
LOG_LEVELS = ("debug", "info", "warning", "error")


def _convert(name: str, raw, where: str):
    t = _TYPES[name]
    try:
        if t in ("bool", bool):
            if isinstance(raw, bool):
                return raw
            v = str(raw).strip().lower()
            if v in ("1", "true", "yes", "on"):
                return True
            if v in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if name == "socket_mode":
            return int(str(raw), 8)
        if t in ("int", int):
            return int(raw)
        if t in ("float", float):
            v = float(raw)
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError(raw)
            return v
        return str(raw)
    except ValueError:
        hint = (" (true or false; as a bare flag, put it after ARTIFACT: `serve ARTIFACT --" + name.replace("_", "-")
                + "`)") if t in ("bool", bool) and where.startswith("--") else ""
        raise ConfigError(f"{where}: bad value {raw!r} for {name}{hint}") from None


def read_config_file(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"config file {p}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p}: not UTF-8 text") from None
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise ConfigError(f"{p}:{n}: expected 'key = value'")
        k, v = (x.strip() for x in line.split("=", 1))
        k = k.replace("-", "_")
        if k not in _TYPES:
            raise ConfigError(f"{p}:{n}: unknown setting {k!r}")
        out[k] = _convert(k, v.strip('"').strip("'"), f"{p}:{n}")
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("artifact", nargs="?", default=None, help="artifact directory (env EDGEOCR_ARTIFACT)")
    ap.add_argument("--config", default=os.environ.get("EDGEOCR_CONFIG"),
                    help="config file of 'key = value' lines (env EDGEOCR_CONFIG)")
    for f in fields(ServerConfig):
        if f.name == "artifact":
            continue
        env = "EDGEOCR_" + f.name.upper()
        default = oct(f.default) if f.name == "socket_mode" else f.default
        switch = dict(nargs="?", const="true") if _TYPES[f.name] in ("bool", bool) else {}    # --metrics = true
        ap.add_argument("--" + f.name.replace("_", "-"), default=None, metavar=f.name.upper(), **switch,
                        help=f"{HELP[f.name]} (env {env}; default {default!r})".replace("%", "%%"))


def resolve(args: argparse.Namespace, environ=os.environ) -> ServerConfig:
    filed = read_config_file(args.config) if getattr(args, "config", None) else {}
    values = {}
    for f in fields(ServerConfig):
        flag = getattr(args, f.name, None)
        env = environ.get("EDGEOCR_" + f.name.upper())
        if flag is not None:
            values[f.name] = _convert(f.name, flag, f"--{f.name.replace('_', '-')}")
        elif env is not None:
            values[f.name] = _convert(f.name, env, "EDGEOCR_" + f.name.upper())
        elif f.name in filed:
            values[f.name] = filed[f.name]
    cfg = ServerConfig(**values)
    validate(cfg)
    return cfg


def validate(cfg: ServerConfig) -> None:
    """Refuse settings the daemon cannot run with, naming the setting."""
    if not cfg.artifact:
        raise ConfigError("no artifact: pass ARTIFACT, set EDGEOCR_ARTIFACT, or 'artifact = ...' in the config file")
    if not cfg.socket and not cfg.tcp:
        raise ConfigError("neither a Unix socket nor TCP is configured")
    if cfg.tcp and not cfg.api_key_file and not cfg.tcp_without_key:
        raise ConfigError(f"tcp {cfg.tcp} without api_key_file: TCP needs a Bearer key file (--api-key-file, "
                          f"EDGEOCR_API_KEY_FILE or api_key_file); --tcp-without-key (tcp_without_key = true) "
                          f"listens with no authentication")
    from edgeocr.serve.parsing import allowed_host_names
    try:
        allowed_host_names(cfg.allowed_hosts)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    positive_ints = ("queue_size", "max_new_tokens", "default_max_new_tokens", "max_body_bytes", "max_pixels",
                     "max_connections", "backlog")
    for name in positive_ints:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    for name in ("deadline_s", "header_timeout_s", "body_timeout_s", "keep_alive_s", "send_timeout_s"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(cfg, name)}")
    if cfg.drain_s < 0:
        raise ConfigError(f"drain_s must be >= 0, got {cfg.drain_s}")
    if cfg.default_max_new_tokens > cfg.max_new_tokens:
        raise ConfigError(f"default_max_new_tokens {cfg.default_max_new_tokens} exceeds max_new_tokens "
                          f"{cfg.max_new_tokens}")
    if cfg.threads < 0:
        raise ConfigError(f"threads must be >= 0, got {cfg.threads}")
    if cfg.device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu' or 'cuda', got {cfg.device!r}")
    if cfg.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {cfg.log_level!r}")
    if not 0 <= cfg.socket_mode <= 0o777:
        raise ConfigError(f"socket_mode must be an octal permission like 660, got {oct(cfg.socket_mode)}")
