"""The one exception tree of sharegpu.

    SharegpuError                 every error we raise on purpose; the CLI prints one line for it
    ├── SpecError                 bad user input: a size, a share, a GPU selector, a tenant name
    │   ├── CommandNotFound       the command to run does not exist (exit 127, as a shell)
    │   ├── AdmissionError        valid, but the node cannot honour it next to the other tenants
    │   └── CdiSpecError          a CDI spec (or a device name in it) that breaks the CDI rules
    ├── ConfigError               a file we read is missing, corrupt or of another ABI version
    ├── DeviceError               GPU discovery or NVML failed (wraps pynvml.NVMLError)
    │   └── UnknownGpu            a GPU selector that matches no GPU of this node (exit 2: bad input)
    ├── TenantError               a tenant operation that cannot be done
    │   ├── TenantNotFound        no such tenant
    │   ├── TenantExists          a tenant of that name exists already
    │   └── TenantBusy            the tenant still has live processes
    └── AgentError                the node agent cannot start, or answered with an unknown error

The agent's API turns each class into an HTTP status and an error code, and its client turns
them back (sharegpu.agent.api / sharegpu.agent.client), so a command fails the same way, with
the same exit status, with and without the agent.

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


class AdmissionError(SpecError):
    """A request that parses but cannot be honoured next to the existing tenants (memory caps
    past the card, compute guarantees past 100%): retry after others shrink or leave."""


class CdiSpecError(SpecError):
    """A CDI spec, or a device name for one, that the CDI specification does not allow."""


class ConfigError(SharegpuError):
    """A configuration or region file that is missing, corrupt or incompatible."""


class DeviceError(SharegpuError):
    """GPU discovery failed or the requested GPU does not exist."""


class UnknownGpu(DeviceError):
    """A GPU index or UUID that matches no GPU (or several) of this node: bad input (exit 2)."""

    exit_code = 2


class TenantError(SharegpuError):
    """A tenant operation failed (unknown tenant, duplicate name, runtime dir not writable)."""


class TenantNotFound(TenantError):
    """No tenant of that name on this node."""


class TenantExists(TenantError):
    """A tenant of that name exists already."""


class TenantBusy(TenantError):
    """The tenant still has live processes (delete it with force, or stop them first)."""


class AgentError(SharegpuError):
    """The node agent cannot start (another one runs), or it failed in a way we do not know."""


__all__ = [
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
