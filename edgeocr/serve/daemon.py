"""The daemon's lifecycle: sockets, the engine thread, uvicorn, signals, drain and systemd notify.

Phases and what a signal (SIGTERM, SIGINT or SIGHUP) does in each:
- loading / warming up: exit at once, code 0 (nothing was accepted yet; the engine thread may be
  inside ONNX Runtime, so the process ends with os._exit and no native object is torn down under it);
- serving: stop accepting (listeners closed, socket file removed), let queued and running requests
  finish for up to `drain_s`, then cancel what is left (those clients get a 503 shutting_down JSON
  error), stop and join the engine thread, close the connections, exit 0;
- draining (a second signal): exit at once, code 0.
systemd: READY=1 after warm-up, STATUS= lines, WATCHDOG=1 from the engine loop, STOPPING=1 on a signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from edgeocr.errors import EdgeOCRError
from edgeocr.sdnotify import Notifier

log = logging.getLogger("edgeocr.serve")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GRACE_S = 3.0            # after the drain: time for replies to reach their clients before connections are cut
STALE_PROBE_S = 1.0      # connect timeout when checking whether an existing socket file has a live daemon


def run(cfg, notifier: Notifier | None = None) -> int:
    return Daemon(cfg, notifier).run()


class Daemon:
    def __init__(self, cfg, notifier: Notifier | None = None):
        from edgeocr.serve.app import ENDPOINTS
        from edgeocr.serve.engine import EngineWorker
        from edgeocr.serve.jobs import Admission
        from edgeocr.serve.metrics import Metrics

        self.cfg = cfg
        self.notifier = notifier or Notifier()
        self.api_key = _read_key(cfg.api_key_file) if cfg.api_key_file else None
        from edgeocr.serve.parsing import allowed_host_names
        self.allowed_hosts = allowed_host_names(cfg.allowed_hosts)
        self.admission = Admission(cfg.queue_size)
        self.metrics = Metrics(ENDPOINTS, self.admission.depth, self.admission.slots_busy)
        self.admission.metrics = self.metrics                 # job moves count cancels and tokens
        self.worker = EngineWorker(cfg, self.admission, self.notifier)
        self.started_at = time.time()
        self.listeners: list[socket.socket] = []
        self.unix_inode: int | None = None      # the socket file we created (never unlink another daemon's)
        self.backlog = effective_backlog(cfg.backlog)
        self.stopping = False                   # a signal started the shutdown
        self.exit_code = 0
        self.server = None

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        for sig in STOP_SIGNALS:                # until the event loop takes over: exit at once
            signal.signal(sig, self._early_signal)
        from edgeocr import artifact
        try:
            artifact.read(Path(self.cfg.artifact))     # a wrong path fails before any socket is bound
        except Exception as e:                  # whatever it is, as the engine thread reports a failed load
            log.error("cannot load %s: %s", self.cfg.artifact, e)
            self.notifier.status(f"failed to load: {e}")
            log.info("stopped (exit 1)")
            return 1
        try:
            self._bind()
            asyncio.run(self._main())          # the engine starts once the server answers (_monitor)
        finally:
            for sig in STOP_SIGNALS:            # the loop is gone: a signal now means exit at once
                signal.signal(sig, self._early_signal)
            self._close_listeners()
            self._unlink_socket()
            if self.worker.ident is not None:
                self.worker.stop()
                self.worker.join()              # the model is released on its own thread before we return
        log.info("stopped (exit %d)", self.exit_code)
        return self.exit_code

    async def _main(self) -> None:
        import uvicorn

        from edgeocr.serve.app import App
        from edgeocr.serve.protocol import MAX_HEADER_BYTES, ConnectionLimits, make_protocol

        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        cfg = self.cfg
        limits = ConnectionLimits(header_timeout_s=cfg.header_timeout_s, send_timeout_s=cfg.send_timeout_s,
                                  max_connections=cfg.max_connections)
        config = uvicorn.Config(App(self), http=make_protocol(limits, self.metrics), ws="none", lifespan="off",
                                interface="asgi3", log_config=None, access_log=False, proxy_headers=False,
                                server_header=False, timeout_keep_alive=cfg.keep_alive_s,
                                timeout_graceful_shutdown=GRACE_S, backlog=self.backlog,
                                h11_max_incomplete_event_size=MAX_HEADER_BYTES)
        logging.getLogger("uvicorn.error").setLevel(logging.ERROR)   # our own lines say what happened
        self.server = _Server(config)
        monitor = asyncio.ensure_future(self._monitor())
        try:
            await self.server.serve(sockets=self.listeners)
        finally:
            monitor.cancel()

    async def _monitor(self) -> None:
        """Start the engine once the server answers, so that readiness says 503 for all of loading and
        warm-up whatever the machine's speed; then end the daemon (exit 1) if the engine fails to load or
        dies."""
        while not self.server.started:
            await asyncio.sleep(0.005)
        if not self.stopping:
            self.worker.start()
        while True:
            await asyncio.sleep(0.1)
            if self.worker.phase == "failed" and not self.stopping:
                log.error("engine failed (%s): exiting", self.worker.error)
                self.exit_code = 1
                self.stopping = True
                self.server.should_exit = True
                return

    # ------------------------------------------------------------------ signals
    def _early_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.worker.ident is not None and self.worker.phase in ("loading", "warming"):
            log.info("%s while %s: exiting", name, "loading" if self.worker.phase == "loading" else "warming up")
        else:
            log.info("%s outside the serving loop: exiting now", name)
        self._exit_now()

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.stopping:
            log.warning("%s again: exiting now", name)
            self._exit_now()
        phase = self.worker.phase
        if phase in ("loading", "warming"):
            log.info("%s while %s: exiting", name, "loading" if phase == "loading" else "warming up")
            self._exit_now()
        self.stopping = True
        asyncio.ensure_future(self._drain(name))

    def _exit_now(self) -> None:
        """Leave without tearing anything down: the engine thread may be inside a native call."""
        self.notifier.stopping()
        self._unlink_socket()
        for h in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                h.flush()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)

    async def _drain(self, name: str) -> None:
        try:
            await self._drain_steps(name)
        except Exception:
            log.exception("drain failed: exiting now")
            self._exit_now()

    async def _drain_steps(self, name: str) -> None:
        cfg = self.cfg
        self.notifier.stopping()
        self.notifier.status("draining")
        self.admission.close()
        for s in getattr(self.server, "servers", []):    # stop accepting; open connections carry on
            s.close()
        self._unlink_socket()
        busy = self.worker.busy()
        log.info("%s: draining %d request(s) for up to %g s; refusing new ones", name, busy, cfg.drain_s)
        end = time.monotonic() + cfg.drain_s
        while not self.worker.idle() and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if not self.worker.idle():
            left = self.worker.busy()
            log.warning("drain time over: cancelling %d request(s)", left)
            self.worker.cancel_all("shutdown")
            end = time.monotonic() + 30.0
            while not self.worker.idle() and time.monotonic() < end:
                await asyncio.sleep(0.02)
        self.worker.stop()
        await asyncio.get_running_loop().run_in_executor(None, self.worker.join, 30.0)
        app = self.server.config.loaded_app
        end = time.monotonic() + GRACE_S
        while getattr(app, "active", 0) and time.monotonic() < end:    # replies still being written
            await asyncio.sleep(0.02)
        self.server.should_exit = True

    # ------------------------------------------------------------------ sockets
    def _bind(self) -> None:
        cfg = self.cfg
        if cfg.socket:
            sock, self.unix_inode = bind_unix(cfg.socket, cfg.socket_mode, self.backlog)
            self.listeners.append(sock)
            log.info("listening on unix:%s (backlog %d)", cfg.socket, self.backlog)
        tcp = parse_tcp(cfg.tcp)
        if tcp and self.api_key is None:
            log.warning("!!! TCP WITHOUT AUTHENTICATION (tcp_without_key = true): any local user or process, and any "
                        "web page a local browser opens that passes the Host/Origin checks, can use this daemon; "
                        "give api_key_file to require a key !!!")
        for family, host, port in tcp:
            try:
                sock = bind_tcp(family, host, port, self.backlog)
            except OSError as e:
                if family == socket.AF_INET6 and e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    log.warning("no IPv6 loopback here: not listening on [%s]:%d", host, port)
                    continue
                raise EdgeOCRError(f"tcp {host}:{port}: {e.strerror}") from None
            self.listeners.append(sock)
            h = f"[{host}]" if family == socket.AF_INET6 else host
            log.info("listening on http://%s:%d (backlog %d)", h, sock.getsockname()[1], self.backlog)
        self.notifier.status("listening, loading the model")

    def _close_listeners(self) -> None:
        for s in self.listeners:
            with contextlib.suppress(OSError):
                s.close()

    def _unlink_socket(self) -> None:
        if not self.cfg.socket or self.unix_inode is None:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.cfg.socket).st_ino == self.unix_inode:
                os.unlink(self.cfg.socket)
        self.unix_inode = None


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server without its signal handlers: the daemon handles signals itself (drain)."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

        def install_signal_handlers(self) -> None:      # older uvicorn releases
            pass

    return Server


def _Server(config):
    return _server_class()(config)


def _read_key(path: str) -> str:
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise EdgeOCRError(f"api_key_file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise EdgeOCRError(f"api_key_file {path}: not UTF-8 text") from None
    if not key:
        raise EdgeOCRError(f"api_key_file {path} is empty")
    return key


def effective_backlog(wanted: int) -> int:
    """The listen backlog: as asked, capped by the kernel's net.core.somaxconn."""
    try:
        return max(1, min(wanted, int(Path("/proc/sys/net/core/somaxconn").read_text())))
    except (OSError, ValueError):
        return wanted


def socket_answers(path: str) -> bool:
    """Whether a daemon is accepting on this Unix socket now (a refused connect means a stale file)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(STALE_PROBE_S)
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:          # timeout, backlog full: someone is there
            return True
        return True


def bind_unix(path: str, mode: int, backlog: int) -> tuple[socket.socket, int]:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EdgeOCRError(f"socket {p}: cannot create its folder {p.parent} ({e.strerror or e}); choose a path "
                           f"this user can write (--socket, e.g. $XDG_RUNTIME_DIR/edgeocr.sock)") from None
    if p.exists() or p.is_symlink():
        if not p.is_socket():
            raise EdgeOCRError(f"socket {p}: the path exists and is not a socket; remove it or choose another")
        if socket_answers(str(p)):
            raise EdgeOCRError(f"socket {p}: another edgeocr daemon is listening on it; stop it first "
                               f"or choose another socket path")
        log.info("removing stale socket file %s (nothing listens on it)", p)
        p.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)                 # created owner-only, then given its configured mode
    try:
        sock.bind(str(p))
    except OSError as e:
        sock.close()
        raise EdgeOCRError(f"socket {p}: {e.strerror}") from None
    finally:
        os.umask(old)
    os.chmod(p, mode)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock, os.stat(p).st_ino


def parse_tcp(spec: str) -> list[tuple[int, str, int]]:
    """'127.0.0.1:8090', '[::1]:8090', 'localhost:8090' (both), comma-separated -> (family, host, port)."""
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        host, sep, port_s = item.rpartition(":")
        if not sep or not port_s.isdigit() or int(port_s) > 65535:
            raise EdgeOCRError(f"tcp {item!r}: expected HOST:PORT, e.g. 127.0.0.1:8090 or [::1]:8090")
        port = int(port_s)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if host in ("", "localhost"):
            out += [(socket.AF_INET, "127.0.0.1", port), (socket.AF_INET6, "::1", port)]
            continue
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise EdgeOCRError(f"tcp {item!r}: {host!r} is not an IP address (use 127.0.0.1 or [::1])") from None
        if not ip.is_loopback:
            raise EdgeOCRError(f"tcp {item!r}: only loopback addresses are allowed (127.0.0.0/8, ::1)")
        out.append((socket.AF_INET6 if ip.version == 6 else socket.AF_INET, str(ip), port))
    return out


def bind_tcp(family: int, host: str, port: int, backlog: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
