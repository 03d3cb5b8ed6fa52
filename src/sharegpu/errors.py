"""The one exception tree of sharegpu.

    SharegpuError                 every error we raise on purpose; the CLI prints one line for it
    ├── SpecError                 bad user input: a size, a share, a GPU selector, a tenant name
    │   └── CommandNotFound       the command to run does not exist (exit 127, as a shell)
    ├── ConfigError               a file we read is missing, corrupt or of another ABI version
    ├── DeviceError               GPU discovery or NVML failed (wraps pynvml.NVMLError)
    └── TenantError               a tenant that does not exist, already exists, or cannot be made

Library errors are wrapped with ``raise ... from err`` so the cause stays in the traceback when
debugging (``SHAREGPU_DEBUG=1``) but the user sees one line. All of these are *permanent*: a
retry with the same input fails the same way. Temporary conditions (a busy lock) are retried
where they happen and never surface as these types.
"""


class SharegpuError(Exception):
    """Base of every error sharegpu raises deliberately."""

    exit_code = 1


class SpecError(SharegpuError, ValueError):
    """User input that does not parse or cannot be honoured."""

    exit_code = 2


class CommandNotFound(SpecError):
    """The command given to `sharegpu run` does not exist or cannot be executed (as a shell)."""

    exit_code = 127


class ConfigError(SharegpuError):
    """A configuration or region file that is missing, corrupt or incompatible."""


class DeviceError(SharegpuError):
    """GPU discovery failed or the requested GPU does not exist."""


class TenantError(SharegpuError):
    """A tenant operation failed (unknown tenant, duplicate name, runtime dir not writable)."""


__all__ = [
    "CommandNotFound",
    "ConfigError",
    "DeviceError",
    "SharegpuError",
    "SpecError",
    "TenantError",
]
