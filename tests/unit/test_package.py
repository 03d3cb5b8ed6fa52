"""The package as a user installs it: public names, the console script, a wheel with the C parts."""

from __future__ import annotations

import sharegpu
from sharegpu import errors


def test_public_names() -> None:
    assert sharegpu.__all__ == ["__version__"]
    assert sorted(errors.__all__) == [
        "AdmissionError",
        "AgentError",
        "CommandNotFound",
        "ConfigError",
        "DeviceError",
        "SharegpuError",
        "SpecError",
        "TenantBusy",
        "TenantError",
        "TenantExists",
        "TenantNotFound",
        "UnknownGpu",
    ]
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.SharegpuError)
