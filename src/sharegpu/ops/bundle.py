"""`sharegpu support-bundle`: one tar.gz with what a bug report needs, and no secrets.

Inside, under `sharegpu-support-<time>/`: status.json, devices.json, tenants.json (the CLI's
JSON documents), events.json (when the agent runs), doctor.json, config.json (directories,
SHAREGPU_* and SIMGPU_* variables, versions) and agent.log (its last MiB, when found). What
cannot be collected is written as <name>.error.txt instead, and the bundle is written anyway.
Nothing else of the environment is read; a variable whose name looks like a credential is
redacted even under those prefixes.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sharegpu import __version__
from sharegpu.errors import SpecError

ENV_PREFIXES = ("SHAREGPU_", "SIMGPU_")
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|KEY|AUTH", re.IGNORECASE)
LOG_TAIL = 1 << 20
AGENT_LOG_ENV = "SHAREGPU_AGENT_LOG"
PACKAGES = ("typer", "rich", "pydantic", "fastapi", "uvicorn", "httpx", "nvidia-ml-py", "numpy")


def safe_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The SHAREGPU_* and SIMGPU_* variables, credential-like names redacted."""
    env = dict(os.environ) if env is None else env
    return {
        k: ("<redacted>" if _SECRET.search(k) else v)
        for k, v in sorted(env.items())
        if k.startswith(ENV_PREFIXES)
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"sharegpu": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def agent_log_candidates(runtime: Path, state: Path) -> list[Path]:
    candidates = [state / "agent.log", runtime / "agent.log"]
    if env := os.environ.get(AGENT_LOG_ENV):
        candidates.insert(0, Path(env))
    return candidates


def _config(runtime: Path, state: Path) -> dict[str, Any]:
    from sharegpu.agent.upgrade import current_shim

    return {
        "runtime_dir": str(runtime),
        "state_dir": str(state),
        "installed_shim": str(current_shim(runtime) or ""),
        "uid": os.geteuid(),
        "environment": safe_environment(),
        "versions": _versions(),
        "time": time.time(),
    }


def collect(runtime: Path | None = None) -> tuple[dict[str, bytes], list[str]]:
    """The bundle's files (name -> content) and notes on what could not be collected."""
    from sharegpu.agent.config import default_state_dir
    from sharegpu.ops.doctor import Context, report_document, run_checks
    from sharegpu.ops.output import devices_items, document, status_item, tenants_items
    from sharegpu.ops.snapshot import take
    from sharegpu.tenant import runtime_dir

    root = runtime or runtime_dir()
    state = default_state_dir()
    files: dict[str, bytes] = {}
    notes: list[str] = []

    def add(name: str, make: Callable[[], Any]) -> None:
        try:
            content = make()
        except Exception as err:  # collect what can be collected
            notes.append(f"{name}: {type(err).__name__}: {err}")
            files[name.rsplit(".", 1)[0] + ".error.txt"] = f"{type(err).__name__}: {err}\n".encode()
            return
        if isinstance(content, bytes):
            files[name] = content
        else:
            files[name] = (json.dumps(content, indent=2) + "\n").encode()

    snap = take(root, events=True, strict=False)
    add("status.json", lambda: document("NodeStatus", [status_item(snap)]))
    add("devices.json", lambda: document("DeviceList", devices_items(snap.gpus)))
    add("tenants.json", lambda: document("TenantList", tenants_items(snap.tenants)))
    if snap.agent is not None:
        add("events.json", lambda: _events(root))
    add("config.json", lambda: _config(root, state))
    add("doctor.json", lambda: report_document(run_checks(Context(runtime_dir=root))))
    logs = [log for log in agent_log_candidates(root, state) if log.is_file()]
    if logs:
        add("agent.log", lambda: _tail(logs[0]))
    elif shutil.which("journalctl"):
        # Under the shipped systemd unit the agent logs to the journal, not to a file.
        add("agent.journal.txt", _journal)
    else:
        notes.append("agent log: no log file, and no journalctl to read the journal")
    return files, notes


JOURNAL_LINES = 5000


def _journal() -> bytes:
    """The agent's unit's last lines in the journal."""
    cmd = [
        "journalctl",
        "--unit",
        "sharegpu-agent",
        "--no-pager",
        "--lines",
        str(JOURNAL_LINES),
        "-o",
        "short-iso",
    ]
    done = subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"journalctl exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
        )
    return done.stdout


def _events(root: Path) -> dict[str, Any]:
    from sharegpu.doors import agent_client, tenant_service
    from sharegpu.ops.output import document

    with tenant_service(root) as service:
        client = agent_client(service)
        if client is None:
            raise RuntimeError("the agent stopped answering")
        items, _ = client.events(limit=1000)
    return document("EventList", [e.model_dump(mode="json") for e in items])


def _tail(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(max(path.stat().st_size - LOG_TAIL, 0))
        return f.read()


def write_bundle(output: Path | None = None, runtime: Path | None = None) -> tuple[Path, list[str]]:
    """Write the bundle to `output` (default ./sharegpu-support-<time>.tar.gz); its path and notes."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"sharegpu-support-{stamp}"
    path = output or Path(f"{base}.tar.gz")
    if path.is_dir():
        path = path / f"{base}.tar.gz"  # a folder: the bundle goes inside it
    folder = path.parent
    if not folder.exists():
        raise SpecError(f"support-bundle: {folder} does not exist (create it, or pick another --output)")
    if not folder.is_dir():
        raise SpecError(f"support-bundle: {folder} is not a directory (pick another --output)")
    files, notes = collect(runtime)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name, content in files.items():
                info = tarfile.TarInfo(f"{base}/{name}")
                info.size = len(content)
                info.mtime = int(time.time())
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(content))
        tmp.replace(path)
    except OSError as err:
        raise SpecError(f"support-bundle: cannot write {path}: {err.strerror or err}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return path.absolute(), notes
