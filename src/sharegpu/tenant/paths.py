"""Where tenants live: the runtime directory, its tenants and gpus folders, and finding a tenant."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sharegpu.errors import SpecError, TenantNotFound
from sharegpu.spec import validate_tenant_id

RUNTIME_ENV = "SHAREGPU_RUNTIME_DIR"
GPUS_DIR = "gpus"


def runtime_dir() -> Path:
    """`SHAREGPU_RUNTIME_DIR`, else /run/sharegpu as root, else $XDG_RUNTIME_DIR/sharegpu."""
    if env := os.environ.get(RUNTIME_ENV):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/run/sharegpu")
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(xdg) / "sharegpu"
    return Path(tempfile.gettempdir()) / f"sharegpu-{os.getuid()}"


def tenants_dir(root: Path | None = None) -> Path:
    return (root or runtime_dir()) / "tenants"


def gpus_dir(root: Path | None = None) -> Path:
    """Where the per-GPU arbiter regions live: <runtime>/gpus/<uuid>/arbiter."""
    return (root or runtime_dir()) / GPUS_DIR


def tenant_path(tenant_id: str, root: Path | None = None) -> Path:
    """The directory of an existing tenant; TenantNotFound when there is none."""
    base = tenants_dir(root)
    try:
        validate_tenant_id(tenant_id)
    except SpecError as err:
        raise TenantNotFound(f"no tenant {tenant_id!r} on this node: {err}") from err
    path = base / tenant_id
    if not path.is_dir():
        raise TenantNotFound(f"no tenant {tenant_id!r} on this node ({base})")
    return path


def iter_tenants(root: Path | None = None) -> Iterator[Path]:
    base = tenants_dir(root)
    try:
        with os.scandir(base) as entries:  # d_type: no stat() per entry
            names = sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return
    for name in names:
        yield base / name
