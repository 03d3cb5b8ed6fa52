"""Hot upgrade of the shim: new processes get the new file, running ones keep theirs.

Layout under the runtime directory::

    <runtime>/shim/libsharegpu-<version>-<sha256[:12]>.so   one file per installed build, 0444,
                                                            never rewritten once installed
    <runtime>/shim/libsharegpu.so                           symlink to the current one (relative)

Tenant processes preload the stable path ``<runtime>/shim/libsharegpu.so``; the dynamic loader
resolves the link when the process starts and maps that file, so:

* a process started before an upgrade keeps the build it mapped, unchanged, until it exits (the
  file is never rewritten nor removed while mapped); it stays capped, since every build of one
  ABI major shares the same regions, ledger and arbiter;
* a process started after the upgrade maps the new build (the link is swapped atomically:
  a new symlink under a temporary name, then ``rename`` over the old one, so a starting process
  sees the old or the new target, never a missing or half-written file);
* a file that is not a shim is refused before anything changes: it must be an ELF shared object
  for this machine, export the hooks (cuInit, cuMemAlloc_v2, cuMemFree_v2, cuLaunchKernel,
  cuGetProcAddress_v2, dlsym, nvmlDeviceGetMemoryInfo), and, when it carries the shim's identity
  marker (native/shim/version.c), be of this package's ABI major;
* old builds are collected: the current and the previous one are always kept (a process may be
  starting with the previous link target right now); older ones are removed once no live
  process maps them (every /proc/<pid>/maps is scanned, by inode so it works across mount
  namespaces). A build that cannot be proven unmapped is kept: while a process whose maps the
  agent cannot read started after the build was installed, the build stays. (A process
  forked before an install that execs with the shim later and hides its maps is the one case
  this misses; run the agent as root in the host's pid namespace.)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sharegpu import native
from sharegpu.agent.events import Event
from sharegpu.agent.procs import proc_info
from sharegpu.errors import ConfigError
from sharegpu.regions import abi
from sharegpu.tenant import directory_lock

SHIM_DIR = "shim"
STABLE_NAME = "libsharegpu.so"
PREVIOUS_FILE = ".previous"
MAX_SIZE = 256 << 20
REQUIRED_SYMBOLS = (
    "cuInit",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuLaunchKernel",
    "cuGetProcAddress_v2",
    "dlsym",
    "nvmlDeviceGetMemoryInfo",
)
_NAME = re.compile(r"^libsharegpu-(?P<version>[A-Za-z0-9.+_-]+)-(?P<sha>[0-9a-f]{12})\.so$")
_IDENT = re.compile(rb"sharegpu-shim: version=([A-Za-z0-9.+_-]{1,64}) abi=(\d+)\.(\d+)\x00")
_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}


@dataclass(frozen=True)
class ShimInfo:
    version: str
    abi: tuple[int, int] | None
    sha256: str


def shim_dir(runtime_dir: Path) -> Path:
    return runtime_dir / SHIM_DIR


def stable_path(runtime_dir: Path) -> Path:
    """What tenant processes preload: a symlink to the current build."""
    return shim_dir(runtime_dir) / STABLE_NAME


# ---------------------------------------------------------------------------------------------
# Validation.


def _dynamic_exports(data: bytes, what: Path) -> set[str]:
    """Names of the defined global/weak symbols of an ELF64 little-endian file's .dynsym."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{what} is not a sharegpu shim: {why}")

    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise bad("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise bad("not a 64-bit little-endian ELF file")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_type != 3:
        raise bad(f"not a shared object (ELF type {e_type})")
    want = _MACHINES.get(platform.machine().lower())
    if want is not None and e_machine != want:
        raise bad(f"built for another machine (ELF machine {e_machine}, this is {platform.machine()})")
    (e_shoff,) = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 58)
    if e_shentsize != 64 or e_shoff + e_shnum * 64 > len(data):
        raise bad("truncated or malformed section table")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * 64) for i in range(e_shnum)]
    names: set[str] = set()
    for sh in sections:
        sh_type, sh_offset, sh_size, sh_link, sh_entsize = sh[1], sh[4], sh[5], sh[6], sh[9]
        if sh_type != 11:  # SHT_DYNSYM
            continue
        if sh_entsize != 24 or sh_link >= len(sections) or sh_offset + sh_size > len(data):
            raise bad("malformed dynamic symbol table")
        str_off, str_size = sections[sh_link][4], sections[sh_link][5]
        strtab = data[str_off : str_off + str_size]
        for off in range(sh_offset, sh_offset + sh_size, 24):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, off)
            bind = st_info >> 4
            if st_shndx == 0 or bind not in (1, 2) or st_name >= len(strtab):  # defined, GLOBAL/WEAK
                continue
            end = strtab.find(b"\0", st_name)
            names.add(strtab[st_name : end if end >= 0 else None].decode(errors="replace"))
    if not names:
        raise bad("it exports no dynamic symbols")
    return names


def inspect_shim(src: Path) -> ShimInfo:
    """Validate `src` as a shim for this machine and ABI; raise ConfigError with the reason."""
    try:
        if not src.is_file():
            raise ConfigError(f"{src}: no such file")
        if src.stat().st_size > MAX_SIZE:
            raise ConfigError(f"{src} is not a sharegpu shim: larger than {MAX_SIZE >> 20} MiB")
        data = src.read_bytes()
    except OSError as err:
        raise ConfigError(f"{src}: {err.strerror}") from err
    exports = _dynamic_exports(data, src)
    missing = [s for s in REQUIRED_SYMBOLS if s not in exports]
    if missing:
        raise ConfigError(f"{src} is not a sharegpu shim: it does not export {', '.join(missing)}")
    version, abi_version = "unknown", None
    if m := _IDENT.search(data):
        version = m.group(1).decode()
        abi_version = (int(m.group(2)), int(m.group(3)))
        if abi_version[0] != abi.ABI_MAJOR:
            raise ConfigError(
                f"{src} is a shim of ABI {abi_version[0]}.{abi_version[1]}; this node speaks "
                f"{abi.ABI_MAJOR}.x (its regions would be refused)"
            )
    return ShimInfo(version=version, abi=abi_version, sha256=hashlib.sha256(data).hexdigest())


# ---------------------------------------------------------------------------------------------
# Installing.


def current_shim(runtime_dir: Path) -> Path | None:
    """The build the stable link names, or None when no shim is installed."""
    link = stable_path(runtime_dir)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    path = link.parent / target
    return path if path.is_file() else None


def _copy_new(src: Path, target: Path, sha256: str) -> None:
    """Write target as a read-only copy of src (temp file + link: never replaces a file)."""
    directory = target.parent
    fd, tmp = tempfile.mkstemp(prefix=".install.", dir=directory)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, src.open("rb") as inp:
            while chunk := inp.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), 0o444)
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise ConfigError(f"{src} changed while it was being installed; try again")
        # An existing name is the same build (the name holds the hash): keep that file.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _swap_link(directory: Path, name: str) -> None:
    tmp = directory / f".{STABLE_NAME}.{os.getpid()}.{os.urandom(4).hex()}"
    os.symlink(name, tmp)
    try:
        os.replace(tmp, directory / STABLE_NAME)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_shim(src: Path, runtime_dir: Path) -> Path:
    """Install `src` as the shim new tenant processes load; returns the installed build.

    Validated first (ConfigError, nothing changed, if it is not a shim for this node). The build
    is copied once to ``<runtime>/shim/libsharegpu-<version>-<sha12>.so`` (an existing file of
    that name is the same bytes and is never rewritten), then the stable link is swapped to it
    atomically, then builds no live process maps are collected (see the module docstring).
    Installing the current build again changes nothing."""
    info = inspect_shim(src)
    directory = shim_dir(runtime_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as err:
        raise ConfigError(f"cannot create {directory}: {err.strerror}") from err
    name = f"libsharegpu-{info.version}-{info.sha256[:12]}.so"
    target = directory / name
    with directory_lock(directory):
        if target.exists():
            existing = hashlib.sha256(target.read_bytes()).hexdigest()
            if existing != info.sha256:
                raise ConfigError(f"{target} exists with other contents; remove it by hand")
        else:
            _copy_new(src, target, info.sha256)
        previous = current_shim(runtime_dir)
        if previous is None or previous.name != name:
            if previous is not None:
                (directory / PREVIOUS_FILE).write_text(previous.name + "\n")
            _swap_link(directory, name)
        collect_old_shims(runtime_dir, _locked=True)
    return target


def ensure_installed(runtime_dir: Path) -> Path:
    """Install the package's own shim when none is installed; returns the stable path to
    preload (``<runtime>/shim/libsharegpu.so``)."""
    if current_shim(runtime_dir) is None:
        install_shim(native.shim_path(), runtime_dir)
    return stable_path(runtime_dir)


def upgrade_event(installed: Path, previous: Path | None) -> Event:
    """The `shim.upgraded` event for an install (for the daemon or the CLI to record)."""
    m = _NAME.match(installed.name)
    return Event(
        kind="shim.upgraded",
        message=f"shim {installed.name} installed"
        + (f" (was {previous.name})" if previous and previous.name != installed.name else "")
        + ": new processes load it, running ones keep theirs",
        data={
            "installed": str(installed),
            "previous": str(previous) if previous else None,
            "version": m.group("version") if m else None,
        },
    )


# ---------------------------------------------------------------------------------------------
# Collecting old builds.


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def mapped_inodes() -> tuple[set[int], list[float]]:
    """Inodes of every file some process maps, and the start instants (Unix time) of the
    processes whose maps could not be read (any of them may map anything)."""
    found: set[int] = set()
    unreadable: list[float] = []
    ticks = os.sysconf("SC_CLK_TCK")
    boot = _boot_time()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/maps", "rb") as f:
                text = f.read()
        except FileNotFoundError:
            continue  # exited
        except OSError:
            info = proc_info(int(entry.name))
            if info is not None:
                unreadable.append(boot + info.start_time / ticks)
            continue
        for line in text.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) >= 6 and parts[4] != b"0":
                found.add(int(parts[4]))
    return found, unreadable


def collect_old_shims(runtime_dir: Path, *, _locked: bool = False) -> list[Path]:
    """Remove installed builds that are neither current nor previous and that no live process
    maps; returns what was removed."""
    directory = shim_dir(runtime_dir)
    if not directory.is_dir():
        return []
    if not _locked:
        with directory_lock(directory):
            return collect_old_shims(runtime_dir, _locked=True)
    current = current_shim(runtime_dir)
    keep = {current.name} if current else set()
    with contextlib.suppress(OSError):
        keep.add((directory / PREVIOUS_FILE).read_text().strip())
    candidates = [p for p in directory.iterdir() if _NAME.match(p.name) and p.name not in keep]
    if not candidates:
        return []
    mapped, unreadable = mapped_inodes()
    removed = []
    for path in candidates:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        # By inode alone (devices differ across some mounts): a false match only keeps a file.
        if st.st_ino in mapped or any(t >= st.st_mtime - 1 for t in unreadable):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed
