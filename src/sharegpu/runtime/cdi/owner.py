"""Who may write a node's CDI spec file: the sharegpu of one runtime directory.

Two sharegpu instances on one host (a test's agent with its own `--runtime-dir`, a second agent
started by mistake) used to overwrite each other's /var/run/cdi/sharegpu.json: the node's
tenant devices became unresolvable, and shape containers made their tenants in the other, dead
directory, outside the node's arbitration, until the real agent happened to write the file
again (issue 36). So a spec file has an owner record beside it, `.<name>.owner` (CDI registries
read only *.json and *.yaml files): the runtime directory it lists, and the process that claimed
it. A writer for another runtime directory is refused while that process lives, and takes the
file over once it is gone; writers for the same directory (the agent, the device plugin,
`sharegpu cdi generate`) share it, and a short-lived one never replaces a live owner's record.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sharegpu.errors import CdiSpecError, SpecError
from sharegpu.regions import liveness


@dataclass(frozen=True)
class Owner:
    runtime_dir: str
    pid: int
    start_time: int

    def alive(self) -> bool:
        return self.pid > 0 and liveness.start_time(self.pid) == self.start_time


def owner_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.owner")


def read_owner(target: Path) -> Owner | None:
    """The spec file's owner record, or None (none yet, or unreadable: no owner to respect)."""
    try:
        data = json.loads(owner_path(target).read_text())
        return Owner(str(data["runtime_dir"]), int(data["pid"]), int(data["start_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def claim(target: Path, root: Path) -> None:
    """Make sure this process, writing the spec of runtime directory `root`, may write `target`:
    CdiSpecError when the live process of another runtime directory owns it."""
    ours = str(root.resolve())
    owner = read_owner(target)
    if owner is not None and owner.alive():
        if owner.runtime_dir == ours:
            return
        raise CdiSpecError(
            f"{target} is the CDI spec of the sharegpu of {owner.runtime_dir} (process {owner.pid}), "
            f"not of {ours}: give this one another file (--cdi-spec PATH, or --cdi-spec none)"
        )
    me = os.getpid()
    record = {"runtime_dir": ours, "pid": me, "start_time": liveness.start_time(me) or 0}
    path = owner_path(target)
    tmp = path.with_name(f"{path.name}.{me}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        # Where the record cannot be written the spec cannot be either: the same bad --output.
        raise SpecError(f"cannot write the CDI spec to {target}: {err.strerror or err}") from err
