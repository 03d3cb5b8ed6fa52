"""systemd's readiness protocol (sd_notify), for `Type=notify` units.

The agent tells the service manager when it is ready (state recovered and the socket bound),
what it is doing (STATUS=, shown by `systemctl status`), that it is alive (WATCHDOG=1, when the
unit sets WatchdogSec=) and that it is stopping. Each message is one datagram to the socket
named by $NOTIFY_SOCKET (an abstract socket when it starts with "@"). Without $NOTIFY_SOCKET
(not started by systemd) every call does nothing.

The protocol is a few lines; the Python packages that wrap it are unmaintained or need
libsystemd at build time, so it is written here from sd_notify(3).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify messages; a no-op without $NOTIFY_SOCKET."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_s = _watchdog_interval(env)
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def send(self, **fields: str | int) -> bool:
        """Send KEY=value lines (keys upper-cased: ready=1 -> READY=1). True if delivered."""
        if not self._address:
            return False
        message = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self._address)
            return True
        except OSError as err:
            if not self._warned:  # the manager went away: say so once, keep running
                log.warning("cannot notify the service manager at %s: %s", self._address, err)
                self._warned = True
            return False

    def ready(self, status: str) -> bool:
        return self.send(ready=1, status=status)

    def status(self, status: str) -> bool:
        return self.send(status=status)

    def watchdog(self) -> bool:
        return self.send(watchdog=1)

    def stopping(self, status: str = "stopping") -> bool:
        return self.send(stopping=1, status=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of WatchdogSec (seconds) when the watchdog is meant for this process, else None."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2e6
