"""Tenant directories: atomic creation, read-back, robust usage mutex, corrupt files reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharegpu.errors import TenantError
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import (
    DeviceLimit,
    create_tenant,
    iter_tenants,
)

UUID0 = "GPU-5a1e0000-0000-4000-8000-000000000000"


def test_too_many_devices(tmp_path: Path) -> None:
    limits = [DeviceLimit(uuid=UUID0, mem_cap_bytes=MIB)] * (abi.MAX_DEVICES + 1)
    with pytest.raises(TenantError, match="at most 16"):
        create_tenant("big", limits, root=tmp_path)
    assert list(iter_tenants(tmp_path)) == []
