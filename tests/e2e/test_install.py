"""The host install (scripts/install-host.sh) on this machine's own Python, as an operator runs
it on a current Debian or Ubuntu, where `pip install .` into the system's Python is refused
(PEP 668): a fresh virtual environment, the command where the systemd unit runs it, the unit.
Issue 36: the first documented step failed there, and the unit expected a command nobody put in
/usr/local/bin."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "scripts" / "install-host.sh"


def test_the_host_install_makes_a_venv_the_command_and_a_unit_that_runs_it(tmp_path: Path) -> None:
    prefix, bin_dir, unit_dir = tmp_path / "opt" / "sharegpu", tmp_path / "bin", tmp_path / "unit"
    args = [str(SCRIPT), "--prefix", str(prefix), "--bin-dir", str(bin_dir), "--unit-dir", str(unit_dir)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    unit = (unit_dir / "sharegpu-agent.service").read_text()
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    command = Path(exec_start.removeprefix("ExecStart=").split()[0])
    assert command == bin_dir / "sharegpu"
    assert command.resolve() == (prefix / "bin" / "sharegpu").resolve()
    version = subprocess.run(
        [str(command), "version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert version.stdout.startswith("sharegpu ")
    # The package in the venv, with a shim built for this host, not the source tree's.
    where = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import sharegpu; print(sharegpu.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(prefix)), where.stdout
    doctor = subprocess.run(
        [str(command), "doctor", "-o", "json"], capture_output=True, text=True, timeout=120, check=False
    )
    (built,) = [c for c in json.loads(doctor.stdout)["items"] if c["name"] == "shim-built"]
    assert built["status"] == "ok", built
    assert str(prefix) in built["message"]
    # Again: an upgrade in place reuses the venv.
    again = subprocess.run(args, capture_output=True, text=True, timeout=900, check=False)
    assert again.returncode == 0, again.stderr


def test_the_host_install_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), "--prefx", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "install-host.sh: unknown argument --prefx (see --help)"
    assert not any(tmp_path.iterdir())
