"""sd_notify: the messages the agent sends to systemd, captured from a test socket."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path

from agentutil import Agent
from conftest import Sim


def _listener(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    return sock


def test_the_agent_tells_systemd_when_it_is_ready_alive_and_stopping(sim: Sim, tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000", "SHAREGPU_LOG_FORMAT": "json"}
    with _listener(path) as sock:
        agent = Agent(sim, tmp_path / "state", env=env)
        try:
            agent.start()
            # READY=1 comes once the socket answers requests (start() waited for that).
            first = sock.recv(4096).decode()
            assert first.startswith("READY=1\nSTATUS=0 tenant(s) on ")
            seen = [sock.recv(4096).decode() for _ in range(3)]
            assert all("WATCHDOG=1" in m for m in seen), seen  # every 0.2 s, half of WatchdogSec
            assert agent.stop() == 0
            rest = []
            with contextlib.suppress(TimeoutError):
                while True:
                    rest.append(sock.recv(4096).decode())
            assert any(m.startswith("STOPPING=1") for m in rest), rest
        finally:
            agent.close()
    # --log-format json (here from the environment): every line of the log is a JSON object.
    lines = [line for line in agent.log.read_text().splitlines() if line.strip()]
    assert lines
    for line in lines:
        record = json.loads(line)
        assert {"time", "level", "logger", "message"} <= record.keys()


def test_print_config_shows_each_value_and_its_source(sim: Sim, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("version: 1\nenforce: kill\n")
    env = sim.env(SHAREGPU_CONFIG=str(tmp_path / "config.yaml"), SHAREGPU_LOG_FORMAT="json")
    proc = sim.cli("agent", "--metrics-port", "9500", "--print-config", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(":", 1)[0]: line for line in proc.stdout.splitlines() if not line.startswith("#")}
    assert rows["metrics_port"].split("#")[1].strip() == "flag --metrics-port"
    assert rows["log_format"].split("#")[1].strip() == "env SHAREGPU_LOG_FORMAT"
    assert rows["enforce"].split("#")[1].strip() == f"file {tmp_path / 'config.yaml'}"
    assert rows["allow_overcommit"].split("#")[1].strip() == "default"
    bad = sim.cli("agent", "--print-config", env=sim.env(SHAREGPU_METRICS_PORT="lots"))
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1
    assert "SHAREGPU_METRICS_PORT" in bad.stderr
