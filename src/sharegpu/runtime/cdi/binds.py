"""What a tenant's container mounts: the one list for both kinds of device (a tenant's, whose
mounts are in the spec, and a shape's, whose hook mounts them).

Its own module, apart from generate.py: the hooks import it at every container start, and must
not pay for the spec's pydantic models (a fifth of a second on a loaded node).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sharegpu.regions import abi


def tenant_binds(root: Path, path: Path, uuids: Iterable[str]) -> list[tuple[Path, str, bool]]:
    """What a container of the tenant at `path` mounts: (host path, container path, writable)."""
    inside = abi.CONTAINER_TENANT_DIR
    binds = [
        (path / abi.LIMITS_FILE, f"{inside}/{abi.LIMITS_FILE}", False),
        (path / abi.USAGE_FILE, f"{inside}/{abi.USAGE_FILE}", True),
    ]
    for uuid in uuids:
        gpu = root / abi.GPUS_DIR / uuid
        if gpu.is_dir():  # a tenant under the `native` policy has no arbiter to mount
            binds.append((gpu, f"{inside}/{abi.GPUS_DIR}/{uuid}", True))
    return binds
