"""The agent's settings: one typed, versioned model and where each value came from.

Precedence, highest first: a command-line flag, a `SHAREGPU_<NAME>` environment variable, the
config file (`/etc/sharegpu/config.yaml`, or `--config FILE` / `$SHAREGPU_CONFIG`), the default.
`sharegpu agent --print-config` shows every value with its source, so an operator never has to
guess which of the four won.

The file is YAML with a `version: 1` key and the same names as the flags, with underscores:

    version: 1
    enforce: kill
    metrics_port: 9479
    state_dir: /var/lib/sharegpu
    arbiter:                       # per GPU (its UUID) or for all (default): sharegpu.agent.tuning
      default: {online_preempt: early, offline_quiet_ns: 2ms}

pydantic-settings reads the environment and the file; this module only adds the order and the
bookkeeping of sources. A malformed file or value is one clear error naming where it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from sharegpu.agent.cpulatency import MAX_US
from sharegpu.agent.metrics import DEFAULT_ADDRESS, DEFAULT_PORT
from sharegpu.agent.tuning import ArbiterTuning, check_keys
from sharegpu.errors import ConfigError
from sharegpu.tenant import runtime_dir

CONFIG_VERSION = 1
DEFAULT_CONFIG_FILE = Path("/etc/sharegpu/config.yaml")
CONFIG_FILE_ENV = "SHAREGPU_CONFIG"
ENV_PREFIX = "SHAREGPU_"


def default_state_dir() -> Path:
    """/var/lib/sharegpu as root, else $XDG_STATE_HOME/sharegpu (~/.local/state/sharegpu)."""
    if os.geteuid() == 0:
        return Path("/var/lib/sharegpu")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sharegpu"


class AgentConfig(BaseSettings):
    """Everything `sharegpu agent` can be told. Field names are the flags' (dashes become
    underscores) and, upper-cased after SHAREGPU_, the environment variables'."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    version: Literal[1] = Field(default=1, description="Version of this settings model")
    runtime_dir: Path = Field(default_factory=runtime_dir, description="Where tenants and the socket live")
    state_dir: Path = Field(default_factory=default_state_dir, description="Where agent.db lives")
    enforce: Literal["report", "kill"] = Field(default="report", description="On a bypass: report, or kill")
    allow_overcommit: bool = Field(default=False, description="Admit memory caps past a card's memory")
    log_format: Literal["text", "json"] = Field(default="text", description="One line per record")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    metrics_port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="Prometheus metrics; 0: off")
    metrics_address: str = Field(default=DEFAULT_ADDRESS, description="Address the metrics server binds")
    qos_target_wait_ms: float = Field(default=2.0, gt=0, le=10_000, description="Online wait target")
    cpu_wakeup_latency_us: int | None = Field(
        default=None,
        ge=0,
        le=MAX_US,
        description="Ask every CPU to wake within this many µs while the agent runs (PM QoS; "
        "0: idle CPUs poll): faster hand-overs between tenants, more power; unset: off",
    )
    cpu_wakeup_latency_while: Literal["agent", "online"] = Field(
        default="agent",
        description="When cpu_wakeup_latency_us is held: for as long as the agent runs, or only "
        "while a tenant of priority online is on the node",
    )
    cdi_spec: str = Field(
        default="/var/run/cdi/sharegpu.json", description="The CDI spec kept current; none: off"
    )
    arbiter: dict[str, ArbiterTuning] = Field(
        default_factory=dict,
        description="Arbiter settings per GPU UUID, or for every GPU under `default` "
        "(online_preempt, preempt_min_kernel_ns, offline_quiet_ns, holdback_max_ns, "
        "online_window_ns, quantum_ns); file/env only",
    )

    @field_validator("arbiter")
    @classmethod
    def _arbiter_keys(cls, value: dict[str, ArbiterTuning]) -> dict[str, ArbiterTuning]:
        return check_keys(value)


Source = str  # "flag --x", "env SHAREGPU_X", "file PATH", "default"


@dataclass(frozen=True)
class LoadedConfig:
    config: AgentConfig
    sources: dict[str, Source]
    file: Path | None  # the file read, if any


def config_file(environ: Mapping[str, str], explicit: Path | None) -> tuple[Path, bool]:
    """The file to read, and whether it must exist (named explicitly) or may be absent."""
    if explicit is not None:
        return explicit, True
    if named := environ.get(CONFIG_FILE_ENV):
        return Path(named), True
    return DEFAULT_CONFIG_FILE, False


def _read_file(path: Path, required: bool) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        if required:
            raise ConfigError(f"{path}: no such config file") from err
        return {}
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, found {type(data).__name__}")
    if data.get("version", CONFIG_VERSION) != CONFIG_VERSION:
        raise ConfigError(
            f"{path}: config version {data.get('version')!r}, this agent reads version {CONFIG_VERSION}"
        )
    return {str(k): v for k, v in data.items()}


def _env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    source = EnvSettingsSource(AgentConfig)
    source.env_vars = {k.lower(): v for k, v in environ.items()}  # this environment, not os.environ
    try:
        values = source()
    except SettingsError as err:  # a complex value (SHAREGPU_ARBITER) that is not JSON
        raise ConfigError(f"invalid environment: {err} (its value must be JSON)") from err
    return {k: v for k, v in values.items() if k != "version"}


def load_config(
    flags: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    file: Path | None = None,
) -> LoadedConfig:
    """Merge flags (only those given: None means not given) > environment > file > defaults."""
    env = dict(os.environ if environ is None else environ)
    path, required = config_file(env, file)
    layers: list[tuple[str, dict[str, Any]]] = [
        (f"file {path}", _read_file(path, required)),
        ("env", _env_values(env)),
        ("flag", {k: v for k, v in flags.items() if v is not None}),
    ]
    merged: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for name, values in layers:
        for key, value in values.items():
            merged[key] = value
            if name == "env":
                sources[key] = f"env {ENV_PREFIX}{key.upper()}"
            elif name == "flag":
                sources[key] = f"flag --{key.replace('_', '-')}"
            else:
                sources[key] = name
    try:
        config = AgentConfig.model_validate(merged)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "settings"
        where = sources.get(str(first["loc"][0]) if first["loc"] else "", "settings")
        ctx = first.get("ctx") or {}
        msg = str(ctx["error"]) if first["type"] == "value_error" and "error" in ctx else first["msg"]
        if first["type"] == "extra_forbidden":
            msg = "unknown setting"
        raise ConfigError(f"invalid {field} (from {where}): {msg}") from err
    for key in AgentConfig.model_fields:
        sources.setdefault(key, "default")
    return LoadedConfig(config=config, sources=sources, file=path if path.exists() else None)


def format_config(loaded: LoadedConfig) -> str:
    """`--print-config`: every setting, its value and where it came from, as YAML with comments."""
    lines = [f"# sharegpu agent settings (version {CONFIG_VERSION}); source of each value on the right"]
    data = loaded.config.model_dump(mode="json")
    width = max(len(k) for k in data) + 2
    for key, value in data.items():
        rendered = yaml.safe_dump({key: value}, default_flow_style=True, width=1000).strip()[1:-1]
        lines.append(f"{rendered:<{width + 30}}# {loaded.sources.get(key, 'default')}")
    return "\n".join(lines) + "\n"


__all__ = ["AgentConfig", "LoadedConfig", "default_state_dir", "format_config", "load_config"]
