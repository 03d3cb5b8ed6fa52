"""The prepared real-GPU validation run (scripts/gpu-check.sh, bench/gpucheck), run here as its
dry run on the simulated GPU: every step reported in one JSON file and one table, the
simulated-GPU steps passed with figures that agree with the model, the CUDA-runtime steps skipped
with the reason, the exit status; and its bad input: an unknown option or step, a report path it
cannot write, a step that runs past its limit, a real run on a machine without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, real_gpu

sys.path.insert(0, str(REPO / "bench"))

from gpucheck.steps import STEPS

RUNTIME_STEPS = [s.name for s in STEPS if s.needs]
DRIVER_API_STEPS = [s.name for s in STEPS if not s.needs and s.name != "suite"]


def env(tmp: Path, **extra: str) -> dict[str, str]:
    found = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SHAREGPU_TENANT")}
    found["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO / "bench")])
    found["GPUCHECK_OUT"] = str(tmp / "default-report.json")
    return found | extra


def gpu_check(tmp: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpucheck", *args],
        cwd=REPO,
        env=env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def dry_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("gpucheck")
    out = tmp / "report.json"
    proc = subprocess.run(
        ["bash", "scripts/gpu-check.sh", "--dry-run", "--quick", "--out", str(out)],
        cwd=REPO,
        env=env(tmp, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert out.exists(), proc.stderr
    return proc, json.loads(out.read_text())


def steps_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in report["steps"]}


@pytest.mark.slow
def test_the_dry_run_reports_every_step_on_the_simulated_gpu(
    dry_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    proc, report = dry_run
    assert proc.returncode == 0, proc.stderr
    assert report["mode"] == "simulated"
    assert report["source"] == "simulated GPU"
    assert [s["name"] for s in report["steps"]] == [s.name for s in STEPS]
    assert all(s["source"] == "simulated GPU" for s in report["steps"])
    by = steps_of(report)
    for name in DRIVER_API_STEPS:
        assert by[name]["status"] == "passed", (name, by[name]["reason"], by[name]["log_tail"])
        assert by[name]["checks"], name
        assert all(c["ok"] for c in by[name]["checks"]), name
    for name in RUNTIME_STEPS:
        assert by[name]["status"] == "skipped"
        assert "cannot run on the simulated GPU" in by[name]["reason"]
        assert "CUDA runtime" in by[name]["reason"]
    assert report["summary"] == {
        "passed": len(DRIVER_API_STEPS),
        "failed": 0,
        "skipped": len(RUNTIME_STEPS) + 1,
        "timed_out": 0,
        "error": 0,
    }
    # The table: one line per step and the tally.
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("sharegpu gpu-check — dry run, simulated GPU")
    for step in STEPS:
        assert any(line.startswith(step.name + " ") for line in lines), step.name
    assert (
        f"{len(STEPS)} steps: {len(DRIVER_API_STEPS)} passed, {len(RUNTIME_STEPS) + 1} skipped" in lines[-1]
    )


@pytest.mark.timing
@pytest.mark.slow
def test_the_dry_run_figures_are_the_models(
    dry_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    by = steps_of(dry_run[1])
    gpu = by["driver"]["figures"]["gpu"]
    assert gpu["name"].startswith("sharegpu simulated")
    assert gpu["memory_total_mib"] == 81920
    memory = by["memory-probe"]["figures"]
    assert memory["inside"]["total"] == 4096 << 20
    assert memory["inside"]["nvml_total"] == 4096 << 20
    assert memory["inside"]["error_type"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert memory["outside"]["nvml_total"] == 81920 << 20
    shares = by["shares-probe"]["figures"]
    for case, configured in (("share 30/70", [30, 70]), ("share 10/90", [10, 90]), ("cap 20% alone", [20])):
        got = shares[case]["achieved_pct"]
        assert all(abs(g - c) <= 2 for g, c in zip(got, configured, strict=True)), (case, got)
        assert all(
            n is not None and abs(n - c) <= 5
            for n, c in zip(shares[case]["nvml_pct"], configured, strict=True)
        )
    assert (
        max(
            abs(g - c)
            for g, c in zip(
                by["graphs-probe"]["figures"]["graphs share 30/70"]["achieved_pct"], [30, 70], strict=True
            )
        )
        <= 2
    )
    online = by["online-probe"]["figures"]
    assert online["p99_ratio_sharegpu"] < online["p99_ratio_time_slicing"]
    assert [r["call"] for r in by["overhead"]["figures"]["rows"]][:2] == [
        "alloc+free 4 KiB",
        "alloc+free 1 MiB",
    ]
    assert set(by["startup"]["figures"]["by_count"]) == {"1", "64"}
    measured = by["timeslice"]["figures"]["measured"]
    assert abs(measured["slice_us"] - 2000) < 200
    assert abs(measured["switch_us"] - 50) < 30
    suite = by["suite"]
    assert suite["status"] == "skipped"
    assert "real-GPU tests not run" in suite["reason"]
    assert suite["figures"]["not_run"]["count"] >= 1
    assert "unchanged" in by["settings"]["summary"]


def test_an_unknown_option_is_one_line_and_still_a_report(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = gpu_check(tmp_path, "--dry-run", "--bogus", "--out", str(out))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("gpu-check: error: unrecognized arguments: --bogus")
    assert "Traceback" not in proc.stderr
    assert "--bogus" in json.loads(out.read_text())["error"]


def test_an_unknown_step_names_the_steps(tmp_path: Path) -> None:
    proc = gpu_check(tmp_path, "--dry-run", "--only", "driver,nosuch")
    assert proc.returncode == 2
    assert "unknown step nosuch: the steps are driver, features" in proc.stderr
    assert json.loads((tmp_path / "default-report.json").read_text())["steps"] == []


def test_a_report_path_it_cannot_write_is_refused_and_the_report_goes_to_the_default(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    proc = gpu_check(tmp_path, "--dry-run", "--only", "driver", "--out", str(blocked / "report.json"))
    assert proc.returncode == 2
    assert f"cannot write the report to {blocked / 'report.json'}" in proc.stderr
    assert str(tmp_path / "default-report.json") in proc.stderr
    assert "cannot write the report" in json.loads((tmp_path / "default-report.json").read_text())["error"]


def test_a_step_past_its_limit_is_killed_with_its_children_and_reported(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = gpu_check(
        tmp_path,
        "--dry-run",
        "--quick",
        "--only",
        "driver,shares-probe",
        "--step-timeout",
        "shares-probe=2",
        "--out",
        str(out),
    )
    assert proc.returncode == 1, proc.stderr
    by = steps_of(json.loads(out.read_text()))
    assert by["driver"]["status"] == "passed"
    assert by["shares-probe"]["status"] == "timed_out"
    assert "killed at its time limit of 2 s" in by["shares-probe"]["reason"]
    assert "timed_out" in proc.stdout
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"gc-share-" in _read(p)]
    assert not left, "a tenant program outlived its step"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_a_real_run_without_a_gpu_says_so(tmp_path: Path) -> None:
    if real_gpu() is None:
        pytest.skip("this machine has a real GPU: the real run would start")
    out = tmp_path / "r.json"
    proc = gpu_check(tmp_path, "--only", "driver", "--out", str(out))
    assert proc.returncode == 2
    assert "no NVIDIA GPU found here" in proc.stderr
    assert "--dry-run" in proc.stderr
    assert "no NVIDIA GPU" in json.loads(out.read_text())["error"]


def test_list_names_every_step_and_what_it_needs(tmp_path: Path) -> None:
    proc = gpu_check(tmp_path, "--list")
    assert proc.returncode == 0
    for step in STEPS:
        assert step.name in proc.stdout
    assert "[needs PyTorch (the CUDA runtime)]" in proc.stdout
