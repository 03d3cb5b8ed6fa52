"""The GPU's settings as the run found them, and nothing of the run left on the GPU.

The runner reads the settings before the first step (settings-before.json in the run's scratch
directory); this step, the last, reads them again and compares, and checks that no process of
the run still holds memory on the GPU and that no tenant is left in the run's runtime directory.
The check changes no setting itself: it never runs nvidia-smi with a setting, never starts MPS
except a private daemon that it stops (features), and never sets a clock or a compute mode.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpucheck import nvmlq
from gpucheck.context import StepContext

BEFORE = "settings-before.json"


def snapshot() -> dict[str, Any]:
    with nvmlq.session():
        _, used = nvmlq.memory(0)
        return {"settings": nvmlq.settings(0), "memory_used": used, "processes": nvmlq.process_used(0)}


def ours(pids: dict[int, int]) -> list[int]:
    """The pids NVML lists that are this run's processes (descendants of the runner)."""
    root = os.getppid()
    found = []
    for pid in pids:
        seen, cur = 0, pid
        while cur > 1 and seen < 64:
            try:
                stat = Path(f"/proc/{cur}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                break
            cur, seen = int(stat[1]), seen + 1
            if cur == root:
                found.append(pid)
                break
    return found


def run(ctx: StepContext) -> None:
    before_path = ctx.target.root / BEFORE
    after = snapshot()
    deadline = time.monotonic() + 10
    while ours(after["processes"]) and time.monotonic() < deadline:  # exiting processes
        time.sleep(0.5)
        after = snapshot()
    ctx.figure("after", after)
    if not before_path.exists():
        raise ctx.skip("the settings were not read before the steps (the runner writes them)")
    before = json.loads(before_path.read_text())
    ctx.figure("before", before)
    changed = {
        k: (v, after["settings"].get(k))
        for k, v in before["settings"].items()
        if after["settings"].get(k) != v
    }
    ctx.check("the GPU's settings are as found", not changed, json.dumps(changed) if changed else "unchanged")
    left = ours(after["processes"])
    ctx.check("no process of the run is left on the GPU", not left, str(left))
    from sharegpu.tenant import iter_tenants

    tenants = sorted(p.name for p in iter_tenants(Path(ctx.target.env["SHAREGPU_RUNTIME_DIR"])))
    ctx.check("no tenant is left", not tenants, ", ".join(tenants))
    ctx.summary(
        f"{len(before['settings'])} settings "
        f"{'unchanged' if not changed else 'CHANGED: ' + ', '.join(changed)}; "
        f"memory used {before['memory_used'] >> 20} → {after['memory_used'] >> 20} MiB"
    )
