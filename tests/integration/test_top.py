"""`sharegpu top`: one frame (--once) and the live screen, with and without the agent, on the
simulated GPU."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentutil import Agent, create
from conftest import Sim
from sharegpu.spec import MIB

ANSI = "\x1b["


def ready(proc: subprocess.Popen[str]) -> subprocess.Popen[str]:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready=1"
    return proc


def stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def plain_env(sim: Sim, **extra: str) -> dict[str, str]:
    """The simulated node's environment with nothing that would force colour on."""
    env = sim.env(**extra)
    for key in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "NO_COLOR"):
        env.pop(key, None)
    env.update(extra)
    return env


def row(text: str, tenant: str) -> str:
    found = [line for line in text.splitlines() if line.split()[:1] == [tenant]]
    assert found, f"no row for {tenant}:\n{text}"
    return found[0]


@pytest.mark.timing
def test_top_once_through_the_agent_measures_compute_over_the_sample(agent: Agent, sim: Sim) -> None:
    busy = create(agent, name="busy", memory="64MiB", gpus=["0"], policy="cap", compute="30%")
    idle = create(agent, name="idle", memory="256MiB", gpus=["1"], priority="offline")
    work = sim.spawn_probe("saturate", "8", "500", env=sim.tenant_env(Path(busy["path"])))
    held = ready(
        sim.spawn_probe(
            "-d", "1", "hold", "plain", str(100 * MIB), "30", env=sim.tenant_env(Path(idle["path"]))
        )
    )
    try:
        time.sleep(1.0)
        proc = sim.cli("top", "--once", "--sample", "2", "--sort", "compute", env=plain_env(sim))
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        print(out)
        assert ANSI not in out  # piped: no escapes
        assert re.search(r"- agent \S+ \(pid \d+\) -", out.splitlines()[0]), out.splitlines()[0]
        assert "rates over the last 2." in out
        lines = out.splitlines()
        assert lines.index(row(out, "busy")) < lines.index(row(out, "idle"))  # sorted by compute
        achieved = re.search(r"(\d+\.\d)% / 30%", row(out, "busy"))
        assert achieved, row(out, "busy")
        assert 10 <= float(achieved.group(1)) <= 45  # a 30% cap, measured over 2 s
        assert "100MiB / 256MiB" in row(out, "idle")
        assert "offline" in row(out, "idle")
        gpu_rows = [line for line in lines if "sharegpu simulated" in line]
        assert len(gpu_rows) == 2
        by_name = sim.cli("top", "--once", "--sample", "0", "--sort", "mem", env=plain_env(sim)).stdout
        assert "rates over each tenant's lifetime" in by_name
        ordered = by_name.splitlines()
        assert ordered.index(row(by_name, "idle")) < ordered.index(row(by_name, "busy"))  # by memory
    finally:
        stop(work, held)


def test_top_once_without_the_agent(sim: Sim) -> None:
    a = sim.tenant("alpha", 64, gpus=[0])
    sim.tenant("beta", 128, gpus=[1])
    held = ready(sim.spawn_probe("hold", "plain", str(32 * MIB), "30", env=sim.tenant_env(a)))
    try:
        env = plain_env(sim, SHAREGPU_NO_AGENT="1")
        proc = sim.cli("top", "--once", "--sample", "0.5", "--sort", "name", env=env)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        print(out)
        assert "no agent (direct)" in out
        lines = out.splitlines()
        assert lines.index(row(out, "alpha")) < lines.index(row(out, "beta"))
        assert "32MiB / 64MiB" in row(out, "alpha")
        assert "0 / 128MiB" in row(out, "beta")
        assert ANSI not in out
    finally:
        stop(held)


def test_top_rejects_an_unknown_sort(sim: Sim) -> None:
    proc = sim.cli("top", "--once", "--sort", "speed")
    assert proc.returncode == 2
    assert "speed" in proc.stderr


def _pty_run(args: list[str], env: dict[str, str]) -> str:
    """Run the CLI with its stdout on a pseudo-terminal; what it wrote."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharegpu.cli", *args], env=env, stdout=child, stderr=child, stdin=child
    )
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(main)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_colour_on_a_terminal_and_none_with_no_color(sim: Sim) -> None:
    sim.tenant("alpha", 64, gpus=[0])
    env = plain_env(sim, SHAREGPU_NO_AGENT="1", TERM="xterm-256color")
    coloured = _pty_run(["top", "--once", "--sample", "0"], env)
    assert ANSI in coloured  # a terminal gets colour (the check below can see escapes)
    plain = _pty_run(["top", "--once", "--sample", "0"], {**env, "NO_COLOR": "1"})
    assert "alpha" in plain
    assert ANSI not in plain
    doctor = _pty_run(["status"], {**env, "NO_COLOR": "1"})
    assert "tenants:" in doctor
    assert ANSI not in doctor


def test_live_top_without_a_terminal_prints_frames_until_sigint(sim: Sim) -> None:
    sim.tenant("alpha", 64, gpus=[0])
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharegpu.cli", "top", "--interval", "0.3"],
        env=plain_env(sim, SHAREGPU_NO_AGENT="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    frames = 0
    deadline = time.monotonic() + 60
    try:
        while frames < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            frames += line.startswith("sharegpu top - ")
        assert frames == 2
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_live_screen_on_a_terminal_sorts_on_a_key_and_quits_on_q(sim: Sim) -> None:
    sim.tenant("alpha", 64, gpus=[0])
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharegpu.cli", "top", "--interval", "0.5"],
        env=plain_env(sim, SHAREGPU_NO_AGENT="1", TERM="xterm-256color"),
        stdin=child,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while b"sort: mem" not in out and time.monotonic() < deadline:
            out += os.read(main, 65536)
        os.write(main, b"c")
        while b"sort: compute" not in out and time.monotonic() < deadline:
            out += os.read(main, 65536)
        os.write(main, b"q")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(main)
    assert b"alpha" in out
    assert b"Traceback" not in out
