"""sd_notify(3) without libsystemd: READY=1, STATUS=, WATCHDOG=1, STOPPING=1 to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None):
        addr = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self.addr = None
        if addr:
            self.addr = "\0" + addr[1:] if addr.startswith("@") else addr
        wd = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        self.watchdog_usec = int(wd) if wd and (not pid or int(pid) == os.getpid()) else 0

    @property
    def enabled(self) -> bool:
        return self.addr is not None

    def send(self, msg: str) -> None:
        if not self.addr:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.connect(self.addr)
                s.sendall(msg.encode())
        except OSError:
            pass   # systemd gone or socket not ours: never fatal

    def ready(self) -> None:
        self.send("READY=1")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")
