"""The node's arbiter settings: what the operator configured for each GPU's arbiter region, kept
in the runtime directory so that every door tunes a new region the same way.

The agent validates its ``arbiter`` settings (sharegpu.agent.tuning) and writes them here when
it starts, as it writes the overcommit rule (sharegpu.tenant.admission); a tenant created without
the agent (`sharegpu run`, the CDI hooks with SHAREGPU_NO_AGENT, or while the agent is down) then
gets the same tuning as one created through it. No file: nothing configured, regions keep the
creator's defaults.

The file maps ``default`` and GPU UUIDs to the tunables' fields (sharegpu.arbiter.TUNABLES), in
the region's units (nanoseconds); a GPU's settings are its entry over ``default``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sharegpu.arbiter import ArbiterStatus, read_arbiter, tune_arbiter

SETTINGS_FILE = "arbiter-settings.json"
DEFAULT_KEY = "default"

Settings = Mapping[str, Mapping[str, int | str]]
Changes = dict[str, tuple[int | str, int | str]]  # field -> (was, now)


def write_arbiter_settings(root: Path, settings: Settings) -> None:
    """Publish the node's settings (already validated) in one rename."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{SETTINGS_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({k: dict(v) for k, v in settings.items()}, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, root / SETTINGS_FILE)


def read_arbiter_settings(root: Path) -> dict[str, dict[str, int | str]]:
    """The node's settings as the agent last wrote them; {} when none (or unreadable: a region
    keeps its defaults, and the agent's loop corrects it when one runs)."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads((root / SETTINGS_FILE).read_text())
        if isinstance(found, dict):
            return {str(k): dict(v) for k, v in found.items() if isinstance(v, dict)}
    return {}


def wanted_for(uuid: str, settings: Settings) -> dict[str, int | str]:
    """What the settings ask of GPU `uuid`'s region: its entry over `default`."""
    wanted: dict[str, int | str] = {}
    for key in (DEFAULT_KEY, uuid):
        wanted |= settings.get(key, {})
    return wanted


def differences(status: ArbiterStatus, wanted: Mapping[str, int | str]) -> Changes:
    """The fields of the region that differ from `wanted`: name -> (now, wanted)."""
    found: Changes = {}
    for name, value in wanted.items():
        now = getattr(status, name)
        if now != value:
            found[name] = (now, value)
    return found


def tune_region(path: Path, settings: Settings) -> tuple[str, Changes]:
    """Bring the arbiter region at `path` to its GPU's settings: its GPU's UUID and what changed
    ({} when nothing differed). A bad value raises SpecError before anything is written."""
    status = read_arbiter(path)
    changes = differences(status, wanted_for(status.uuid, settings))
    if changes:
        values: dict[str, Any] = {name: new for name, (_, new) in changes.items()}
        tune_arbiter(path, **values)
    return status.uuid, changes
