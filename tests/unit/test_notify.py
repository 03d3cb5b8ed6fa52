"""sd_notify: the messages the agent sends to systemd, captured from a test socket."""

from __future__ import annotations

import os
import socket
from contextlib import closing
from pathlib import Path

from sharegpu.agent.notify import Notifier


def _listener(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    return sock


def test_messages_reach_the_socket_named_by_notify_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with _listener(path) as sock:
        n = Notifier({"NOTIFY_SOCKET": path})
        assert n.enabled
        assert n.ready("3 tenants on 2 GPUs")
        assert sock.recv(4096) == b"READY=1\nSTATUS=3 tenants on 2 GPUs"
        assert n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert n.stopping()
        assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping"
        n.close()


def test_an_abstract_socket_name(tmp_path: Path) -> None:
    name = f"sharegpu-test-{os.getpid()}"
    with _listener("\0" + name) as sock, closing(Notifier({"NOTIFY_SOCKET": "@" + name})) as n:
        assert n.status("recovering")
        assert sock.recv(4096) == b"STATUS=recovering"


def test_without_systemd_nothing_is_sent_and_nothing_fails(tmp_path: Path) -> None:
    n = Notifier({})
    assert not n.enabled
    assert not n.ready("x")
    with closing(Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})) as gone:
        assert not gone.ready("x")  # the manager went away: the agent keeps running
        assert not gone.watchdog()


def test_the_watchdog_interval_is_half_of_watchdog_sec() -> None:
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_s == 15.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 15.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_s is None  # not ours
    assert Notifier({"WATCHDOG_USEC": "soon"}).watchdog_s is None
    assert Notifier({}).watchdog_s is None
