"""The Container Device Interface spec file: its fields, its rules, its lowest version.

Written from the CDI specification (github.com/cncf-tags/container-device-interface, SPEC.md):
the JSON fields of a spec, a device and its `containerEdits`; the rules for `kind` (a DNS-subdomain
prefix, a slash, a name of at most 63 characters) and device names; the version table that says
which field needs which `cdiVersion`. A runtime refuses a spec that uses a field newer than its
`cdiVersion`, and one whose `cdiVersion` is newer than it knows (Debian 12's podman 4.3.1 reads up
to 0.5.0), so a spec is written with the lowest version its fields need, as the CDI project's own
tools do.

Every spec sharegpu writes goes through `validate`: all problems at once, each naming its field.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from sharegpu.errors import CdiSpecError

EARLIEST_VERSION = "0.3.0"  # the first tagged release of the spec
KNOWN_HOOKS = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$")
_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
_ENV = re.compile(r"^[^=\0]+=[^\0]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class DeviceNode(_Strict):
    path: str
    host_path: str | None = Field(default=None, alias="hostPath")
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = Field(default=None, alias="fileMode")
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None


class Mount(_Strict):
    host_path: str = Field(alias="hostPath")
    container_path: str = Field(alias="containerPath")
    type: str | None = None
    options: list[str] | None = None


def bind_mount(host_path: str, container_path: str, *, writable: bool = False) -> Mount:
    """A bind mount as OCI runtimes read one: by its options, with no `type` (which would need
    cdiVersion 0.4.0)."""
    options = ["rw" if writable else "ro", "nosuid", "nodev", "bind"]
    return Mount(hostPath=host_path, containerPath=container_path, options=options)


class Hook(_Strict):
    hook_name: str = Field(alias="hookName")
    path: str
    args: list[str] | None = None
    env: list[str] | None = None
    timeout: int | None = None


class ContainerEdits(_Strict):
    env: list[str] | None = None
    device_nodes: list[DeviceNode] | None = Field(default=None, alias="deviceNodes")
    mounts: list[Mount] | None = None
    hooks: list[Hook] | None = None
    additional_gids: list[int] | None = Field(default=None, alias="additionalGids")


class Device(_Strict):
    name: str
    annotations: dict[str, str] | None = None
    container_edits: ContainerEdits = Field(default_factory=ContainerEdits, alias="containerEdits")


class Spec(_Strict):
    cdi_version: str = Field(alias="cdiVersion")
    kind: str
    annotations: dict[str, str] | None = None
    devices: list[Device]
    container_edits: ContainerEdits | None = Field(default=None, alias="containerEdits")

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2) + "\n"


# ---- rules -----------------------------------------------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _all_edits(spec: Spec) -> list[ContainerEdits]:
    edits = [d.container_edits for d in spec.devices]
    return [*edits, spec.container_edits] if spec.container_edits else edits


def minimum_version(spec: Spec) -> str:
    """The lowest `cdiVersion` whose fields cover everything the spec uses."""
    edits = _all_edits(spec)
    _, _, kind_name = spec.kind.partition("/")
    if any(e.additional_gids for e in edits):
        return "0.7.0"
    if spec.annotations or any(d.annotations for d in spec.devices) or "." in kind_name:
        return "0.6.0"
    if any(d.name[:1].isdigit() for d in spec.devices) or any(
        n.host_path for e in edits for n in e.device_nodes or ()
    ):
        return "0.5.0"
    if any(m.type for e in edits for m in e.mounts or ()):
        return "0.4.0"
    return EARLIEST_VERSION


def kind_problems(kind: str) -> list[str]:
    prefix, slash, name = kind.partition("/")
    problems = []
    if not slash or "/" in name:
        return [f"kind {kind!r}: must be <vendor domain>/<name>, like sharegpu.io/vgpu"]
    labels = prefix.split(".")
    if len(prefix) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        problems.append(f"kind {kind!r}: the prefix must be a DNS subdomain (lowercase labels and dots)")
    if len(name) > 63 or not _NAME.match(name):
        problems.append(
            f"kind {kind!r}: the name must be 1-63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return problems


def device_name_problems(name: str) -> list[str]:
    if not _NAME.match(name):
        return [
            f"device name {name!r}: use letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        ]
    return []


def _edit_problems(where: str, edits: ContainerEdits) -> list[str]:
    problems = []
    for i, env in enumerate(edits.env or ()):
        if not _ENV.match(env):
            problems.append(f"{where}.env[{i}] {env!r}: must be NAME=VALUE")
    for i, node in enumerate(edits.device_nodes or ()):
        if not node.path.startswith("/"):
            problems.append(f"{where}.deviceNodes[{i}].path {node.path!r}: must be absolute")
        if node.permissions is not None and not re.fullmatch(r"r?w?m?", node.permissions):
            problems.append(f"{where}.deviceNodes[{i}].permissions {node.permissions!r}: use r, w, m")
    for i, mount in enumerate(edits.mounts or ()):
        if not mount.host_path:
            problems.append(f"{where}.mounts[{i}].hostPath: must not be empty")
        if not mount.container_path.startswith("/"):
            problems.append(f"{where}.mounts[{i}].containerPath {mount.container_path!r}: must be absolute")
    for i, hook in enumerate(edits.hooks or ()):
        if hook.hook_name not in KNOWN_HOOKS:
            problems.append(
                f"{where}.hooks[{i}].hookName {hook.hook_name!r}: use one of {', '.join(KNOWN_HOOKS)}"
            )
        if not hook.path.startswith("/"):
            problems.append(f"{where}.hooks[{i}].path {hook.path!r}: must be absolute")
        if hook.timeout is not None and hook.timeout <= 0:
            problems.append(f"{where}.hooks[{i}].timeout {hook.timeout}: must be greater than zero")
        problems += [
            f"{where}.hooks[{i}].env {env!r}: must be NAME=VALUE"
            for env in hook.env or ()
            if not _ENV.match(env)
        ]
    for i, gid in enumerate(edits.additional_gids or ()):
        if not 0 <= gid < 1 << 32:
            problems.append(f"{where}.additionalGids[{i}] {gid}: must be a uint32")
    return problems


def problems(spec: Spec) -> list[str]:
    """Everything that makes the spec invalid, each naming its field."""
    found = []
    if not _SEMVER.match(spec.cdi_version):
        found.append(f"cdiVersion {spec.cdi_version!r}: must be a semantic version like 0.5.0")
    else:
        need = minimum_version(spec)
        if _version_key(spec.cdi_version) < _version_key(need):
            found.append(f"cdiVersion {spec.cdi_version}: the fields used need {need} or later")
    found += kind_problems(spec.kind)
    if not spec.devices:
        found.append("devices: a spec must list at least one device")
    seen: set[str] = set()
    for i, device in enumerate(spec.devices):
        found += [f"devices[{i}]: {p}" for p in device_name_problems(device.name)]
        if device.name in seen:
            found.append(f"devices[{i}]: device name {device.name!r} is listed twice")
        seen.add(device.name)
        found += _edit_problems(f"devices[{i}].containerEdits", device.container_edits)
    if spec.container_edits:
        found += _edit_problems("containerEdits", spec.container_edits)
    return found


def validate(spec: Spec) -> Spec:
    """The spec itself, or CdiSpecError listing every problem."""
    if found := problems(spec):
        raise CdiSpecError("invalid CDI spec: " + "; ".join(found))
    return spec
