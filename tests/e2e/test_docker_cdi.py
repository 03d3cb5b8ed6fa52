"""Docker outside Kubernetes with sharegpu's CDI device: `docker run --device sharegpu.io/vgpu=NAME`
against a real Docker Engine 28.5 (dockerd and the docker CLI that `make kube` builds from the Go
module proxy, scripts/build-kube.sh), the tenant made by `sharegpu create` on a simulated GPU and
the spec written by `sharegpu cdi generate`, as the ctr test of test_kube_real_sharegpu.py does
with containerd 2's own client.

The test starts a dockerd of its own with everything under its tmp dir (data and exec roots, its
socket, the CDI spec directory, the containerd dockerd starts from `make kube`'s containerd 2), no
iptables, bridge or userland proxy, and containers with `--network none`. It runs in a private
mount namespace with a tmpfs on /run: containerd's shims put their sockets in /run/containerd/s
and dockerd makes /run/docker/plugins whatever its roots, and the host's /run (a Kubernetes
node's containerd among it) stays untouched. Stopped, it must leave no process and no cgroup.

Part of `make test` (after `make kube`); needs root and Debian's runc; fails, never skips, when one
is missing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import Sim, parse_kv, wait_for
from e2e.kubenode import kube_bin
from e2e.kubesharegpu import PROBE_IMAGE, oci_archive
from sharegpu.runtime.rootfs import build_rootfs
from sharegpu.spec import MIB

# What the engine needs from `make kube`: dockerd starts containerd (and its shim) from its PATH.
BINARIES = ("dockerd", "docker", "containerd", "containerd-shim-runc-v2")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


@dataclass
class Engine:
    """A private dockerd and the CLI that talks to it."""

    root: Path
    cdi: Path  # the daemon's only CDI spec directory
    docker_bin: Path
    env: dict[str, str]
    started_s: float

    def docker(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.docker_bin), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def leftovers(self) -> list[str]:
        """Containers the daemon still has, one line each."""
        ps = self.docker("ps", "-a", "--format", "{{.ID}} {{.Names}} {{.Status}}")
        assert ps.returncode == 0, ps.stderr
        return ps.stdout.splitlines()

    def wait_device(self, device: str) -> float:
        """Wait until dockerd lists `device` (`docker info`'s DiscoveredDevices): its CDI cache
        re-reads the spec directory on an inotify event, a moment after the spec is written."""
        t0 = time.monotonic()

        def listed() -> bool:
            info = self.docker("info", "--format", "{{json .DiscoveredDevices}}")
            assert info.returncode == 0, info.stderr
            return any(d["ID"] == device for d in json.loads(info.stdout) or [] if d["Source"] == "cdi")

        wait_for(listed, f"dockerd listing the CDI device {device}", timeout=10)
        return time.monotonic() - t0


def _processes_under(root: Path) -> list[tuple[int, str]]:
    """Processes whose command line names a path under root (dockerd, its containerd, the shims)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if str(root) in cmdline:
            found.append((int(entry.name), cmdline.strip()))
    return found


def _cgroups(parent: str) -> set[Path]:
    """parent's directory in each cgroup hierarchy (v1: one per controller; cpu and cpuacct may be
    links to one)."""
    return {d.resolve() for d in Path("/sys/fs/cgroup").glob(f"*/{parent}") if d.is_dir()}


def _docker_archive(oci: Path, out: Path) -> Path:
    """oci (scripts/oci-image.py's OCI layout in a tar) with the manifest.json of `docker save`
    added: dockerd 28 with its graph drivers (not the containerd image store) loads an archive by
    its manifest.json and takes one without it for the pre-1.10 format."""
    with tarfile.open(oci) as src, tarfile.open(out, "w") as dst:

        def blob(digest: str) -> str:
            return "blobs/sha256/" + digest.split(":", 1)[1]

        def read(name: str) -> Any:
            member = src.extractfile(name)
            assert member is not None, name
            return json.load(member)

        (entry,) = read("index.json")["manifests"]
        manifest = read(blob(entry["digest"]))
        docker_manifest = [
            {
                "Config": blob(manifest["config"]["digest"]),
                "RepoTags": [entry["annotations"]["io.containerd.image.name"]],
                "Layers": [blob(layer["digest"]) for layer in manifest["layers"]],
            }
        ]
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        data = json.dumps(docker_manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        dst.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if os.geteuid() != 0:
        pytest.fail("the Docker test needs root (dockerd, containerd, runc)")
    bin_dir = kube_bin()
    missing = [name for name in BINARIES if not (bin_dir / name).is_file()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing in {bin_dir}: run `make kube` (scripts/build-kube.sh builds them)"
        )
    if shutil.which("runc", path=SYSTEM_PATH) is None:
        pytest.fail("runc is not installed (Debian: apt-get install runc)")
    root = tmp_path_factory.mktemp("docker")
    cdi = root / "cdi"
    cdi.mkdir()
    # The daemon's own config file, so that a host's /etc/docker/daemon.json is not read; CDI is on
    # by default since 28.2, the spec directory is given below.
    (root / "daemon.json").write_text("{}\n")
    cgroup_parent = f"sharegpu-docker-e2e-{os.getpid()}"  # not the host's /docker
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    env["PATH"] = f"{bin_dir}:{SYSTEM_PATH}"
    dockerd = [
        str(bin_dir / "dockerd"),
        *("--config-file", str(root / "daemon.json")),
        *("--data-root", str(root / "data"), "--exec-root", str(root / "exec")),
        *("--pidfile", str(root / "docker.pid"), "-H", f"unix://{root}/docker.sock"),
        *("--iptables=false", "--ip6tables=false", "--bridge=none", "--userland-proxy=false"),
        *("--storage-driver", "vfs", "--cdi-spec-dir", str(cdi), "--cgroup-parent", cgroup_parent),
    ]
    # unshare execs sh, which execs dockerd: the Popen's pid is dockerd's.
    script = 'mount -t tmpfs -o mode=0755,size=16m sharegpu-docker-run /run && exec "$@"'
    log = (root / "dockerd.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *dockerd],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client_env = {**env, "DOCKER_HOST": f"unix://{root}/docker.sock", "DOCKER_CONFIG": str(root / "cli")}
    daemon = Engine(root, cdi, bin_dir / "docker", client_env, 0.0)
    try:
        while True:
            version = daemon.docker("version", "--format", "{{.Server.Version}}", timeout=30)
            if version.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() - t0 > START_TIMEOUT_S:
                pytest.fail(f"dockerd did not come up:\n{version.stderr}\n{_tail(root / 'dockerd.log')}")
            time.sleep(0.1)
        daemon.started_s = time.monotonic() - t0
        print(f"\ndockerd {version.stdout.strip()} answering {daemon.started_s:.2f} s after its start")
        yield daemon
    finally:
        t_stop = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
            stopped = f"dockerd stopped in {time.monotonic() - t_stop:.2f} s (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stopped = f"dockerd did not stop in {STOP_TIMEOUT_S:.0f} s: killed"
        log.close()
        print(stopped)
        # Its containerd and the shims run on a moment after dockerd: wait for them, then clean
        # up whatever is left before failing, so that a failure leaves the host clean too.
        deadline = time.monotonic() + 10
        while _processes_under(root) and time.monotonic() < deadline:
            time.sleep(0.1)
        stray = _processes_under(root)
        for pid, _ in stray:
            with contextlib.suppress(ProcessLookupError):  # it went on its own meanwhile
                os.kill(pid, signal.SIGKILL)
        # runc removes a container's cgroup when it is deleted; the parent it made for the first
        # one is the test's to remove (rmdir of a cgroup takes its control files with it).
        parents = _cgroups(cgroup_parent)
        containers = sorted(str(c) for parent in parents for c in parent.glob("**/") if c != parent)
        for parent in parents:
            for cgroup in sorted(parent.glob("**/"), key=lambda p: len(p.parts), reverse=True):
                cgroup.rmdir()
        mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(root) in line]
        assert not stray, f"left running after dockerd stopped: {stray}"
        assert not containers, f"container cgroups left behind: {containers}"
        assert not mounts, f"the host sees mounts of the private namespace: {mounts}"
        assert "Daemon shutdown complete" in (root / "dockerd.log").read_text(), _tail(root / "dockerd.log")


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def probe_image(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The probe image of the Kubernetes tests (busybox, sgprobe and their libraries; the driver
    and the shim come with the CDI device) loaded with `docker load`."""
    root = tmp_path_factory.mktemp("docker-image")
    oci = oci_archive(build_rootfs(root / "probe-rootfs"), PROBE_IMAGE, root / "probe.tar")
    t0 = time.monotonic()
    loaded = engine.docker("load", "-i", str(_docker_archive(oci, root / "probe-docker.tar")))
    assert loaded.returncode == 0, loaded.stderr
    assert f"Loaded image: {PROBE_IMAGE}" in loaded.stdout, loaded.stdout
    print(f"docker load of the probe image ({oci.stat().st_size // 1024} KiB): {time.monotonic() - t0:.2f} s")
    return PROBE_IMAGE


def test_docker_run_with_the_cdi_device_sees_its_vgpu_and_is_refused_past_its_cap(
    engine: Engine, probe_image: str, sim: Sim
) -> None:
    """`docker run --device sharegpu.io/vgpu=NAME`: dockerd resolves the name in its CDI spec
    directory and the probe inside sees its tenant's 512 MiB and is refused past it."""
    name = f"docker-e2e-{os.getpid()}"
    made = sim.cli("create", name, "--memory", "512MiB", "--gpu", "0")
    assert made.returncode == 0, made.stderr
    spec = engine.cdi / "sharegpu.json"
    try:
        generated = sim.cli("cdi", "generate", "--shape", "none", "--output", str(spec))
        assert generated.returncode == 0, generated.stderr
        device = f"sharegpu.io/vgpu={name}"
        seen = engine.wait_device(device)
        probe = ["sh", "-c", "sgprobe info; sgprobe alloc plain 400M 200M"]
        t0 = time.monotonic()
        run = engine.docker("run", "--rm", "--network", "none", "--device", device, probe_image, *probe)
        took = time.monotonic() - t0
    finally:
        spec.unlink(missing_ok=True)
        spec.with_name(f".{spec.name}.owner").unlink(missing_ok=True)  # cdi generate's claim on it
        sim.cli("delete", name, "--force")
    assert run.returncode == 0, run.stderr
    values, lines = parse_kv(run.stdout)
    assert values["dev0.total"] == str(512 * MIB), run.stdout
    assert [v for k, v in lines if k == "alloc"] == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"], run.stdout
    assert engine.leftovers() == []  # --rm
    print(f"spec listed by dockerd {seen:.2f} s after it was written")
    total, free = values["dev0.total"], values.get("free")
    print(f"docker run with the CDI device: {took:.2f} s; total {total}, free after 400M {free}")


def test_docker_run_with_an_unknown_cdi_device_fails_naming_it_and_leaves_nothing(
    engine: Engine, probe_image: str, sim: Sim
) -> None:
    """A CDI name with no spec behind it: dockerd refuses the container with the CDI library's
    error naming the device, and no container is left."""
    made = sim.cli("create", "known", "--memory", "512MiB", "--gpu", "0")
    assert made.returncode == 0, made.stderr
    spec = engine.cdi / "sharegpu.json"
    try:
        # A spec is there (for `known`), so the failure is the name's, not an empty directory's.
        generated = sim.cli("cdi", "generate", "--shape", "none", "--output", str(spec))
        assert generated.returncode == 0, generated.stderr
        engine.wait_device("sharegpu.io/vgpu=known")
        device = "sharegpu.io/vgpu=no-such-tenant"
        run = engine.docker("run", "--rm", "--network", "none", "--device", device, probe_image, "true")
    finally:
        spec.unlink(missing_ok=True)
        spec.with_name(f".{spec.name}.owner").unlink(missing_ok=True)
        sim.cli("delete", "known", "--force")
    assert run.returncode == 125, (
        run.returncode,
        run.stdout,
        run.stderr,
    )  # the daemon's error, not the command's
    assert f"CDI device injection failed: unresolvable CDI devices {device}" in run.stderr, run.stderr
    assert engine.leftovers() == []
    print(f"unknown CDI device: {run.stderr.strip().splitlines()[0]}")
