"""sharegpu gpu-check: the validation run on a real NVIDIA GPU, or its dry run on the simulated GPU.

    scripts/gpu-check.sh [--dry-run] [--quick] [--out FILE] [--only STEPS] [--skip STEPS]
                         [--budget SECONDS] [--step-timeout STEP=SECONDS] [--no-compare] [--list]

Runs each step (see --list) in a process of its own, bounded in time, writes every result to
one JSON file (--out) and prints one table. On a real GPU each driver-API step also runs on the
simulated GPU (at --quick scale) and its figures stand beside the real ones; --no-compare leaves
that out. --dry-run runs every step on a private simulated GPU, skipping (and reporting, with
the reason) only the steps that need CUDA-runtime programs.

Exit status: 0 every step passed or was skipped with a reason; 1 a step failed, broke off or
ran past its time limit; 2 bad input (the report is written all the same: to --out when it can
be, else to the default place, and the message names it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from gpucheck import runner
from gpucheck.report import BAD, StepResult, counts, report_dict, table, write_json_atomic
from gpucheck.steps import BY_NAME, STEPS, Step
from gpucheck.target import REAL, REPO, SIMULATED, real_environment, simulated_environment
from sharegpu.native import LIB_DIR

# The report's place when --out names none (and where it goes when --out cannot be written).
DEFAULT_OUT = Path(os.environ.get("GPUCHECK_OUT") or REPO / "build" / "gpu-check" / "report.json")
# Under 8 minutes in all on a real GPU (issue 15), the simulated comparison included.
REAL_BUDGET_S = 450.0
DRY_BUDGET_S = 300.0


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="gpu-check",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dry-run", action="store_true", help="run the steps on a private simulated GPU")
    ap.add_argument("--quick", action="store_true", help="shorter measurements (the CI dry run)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the JSON report (default {DEFAULT_OUT})")
    ap.add_argument("--only", default="", help="comma-separated steps to run (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated steps to leave out")
    ap.add_argument(
        "--budget",
        type=float,
        help=f"seconds for the whole run (default {REAL_BUDGET_S:g}, dry {DRY_BUDGET_S:g})",
    )
    ap.add_argument(
        "--step-timeout", action="append", default=[], metavar="STEP=SECONDS", help="a step's time limit"
    )
    ap.add_argument("--no-compare", action="store_true", help="real GPU: no simulated figures beside")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, tenants)")
    ap.add_argument("--list", action="store_true", help="list the steps and exit")
    return ap


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise UsageError(f"unknown step {', '.join(unknown)}: the steps are {', '.join(BY_NAME)}")
    return names


def _timeouts(items: list[str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        _names(name)
        try:
            seconds = float(value) if sep else -1
        except ValueError:
            seconds = -1
        if seconds <= 0:
            raise UsageError(f"--step-timeout {item!r}: give STEP=SECONDS, SECONDS > 0")
        found[name] = seconds
    return found


def _writable(path: Path) -> str | None:
    """Why the report cannot be written to `path`, or None."""
    if path.is_dir():
        return "it is a directory"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=True):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def _fallback(out: Path | None) -> Path:
    for candidate in (out, DEFAULT_OUT, Path(tempfile.gettempdir()) / "sharegpu-gpu-check.json"):
        if candidate is not None and _writable(candidate) is None:
            return candidate
    return Path(tempfile.gettempdir()) / "sharegpu-gpu-check.json"


def _commit() -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None


def _meta(mode: str, argv: list[str], began: float, budget: float) -> dict[str, Any]:
    return {
        "tool": "sharegpu gpu-check",
        "mode": mode,
        "source": "real GPU" if mode == REAL else "simulated GPU",
        "argv": argv,
        "started": datetime.datetime.fromtimestamp(began, datetime.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - began, 1),
        "budget_s": budget,
        "host": {"name": socket.gethostname(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "commit": _commit(),
    }


def _error_report(out: Path | None, argv: list[str], message: str) -> Path:
    path = _fallback(out)
    began = time.time()
    data = report_dict(_meta("unknown", argv, began, 0.0) | {"error": message}, [])
    write_json_atomic(path, data)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        only, skip = _names(args.only), _names(args.skip)
        timeouts = _timeouts(args.step_timeout)
        if args.budget is not None and args.budget <= 0:
            raise UsageError("--budget must be a positive number of seconds")
    except UsageError as err:
        out = _out_from(argv)
        path = _error_report(out, argv, str(err))
        print(f"gpu-check: error: {err} (report: {path}; --help lists the options)", file=sys.stderr)
        return 2
    if args.list:
        for step in STEPS:
            needs = f"  [needs {step.needs}]" if step.needs else ""
            print(f"{step.name:<14} {step.title}{needs}")
        return 0
    why = _writable(args.out)
    if why is not None:
        path = _error_report(None, argv, f"cannot write the report to {args.out}: {why}")
        print(
            f"gpu-check: error: cannot write the report to {args.out}: {why} (report: {path})",
            file=sys.stderr,
        )
        return 2
    steps = [s for s in STEPS if (not only or s.name in only) and s.name not in skip]
    return _run(args, argv, steps, timeouts)


def _out_from(argv: list[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1])
    return None


def _progress(result: StepResult) -> None:
    line = f"gpu-check: {result.name} ({result.source}): {result.status} in {result.duration_s:.1f} s"
    if result.status != "passed" and result.reason:
        line += f": {result.reason}"
    print(line[:400], file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, argv: list[str], steps: list[Step], timeouts: dict[str, float]) -> int:
    mode = SIMULATED if args.dry_run else REAL
    seconds = args.budget or (DRY_BUDGET_S if args.dry_run else REAL_BUDGET_S)
    began_wall, budget = time.time(), runner.Budget(seconds, time.monotonic())
    scratch = Path(tempfile.mkdtemp(prefix="sharegpu-gpu-check-"))
    try:
        if mode == REAL:
            env = real_environment(scratch / "real")
            problem = _real_gpu_problem(env)
            if problem is not None:
                path = _error_report(args.out, argv, problem)
                print(f"gpu-check: error: {problem} (report: {path})", file=sys.stderr)
                return 2
        else:
            env = simulated_environment(scratch / "sim")
        results = runner.run_steps(
            steps,
            env,
            workdir=scratch,
            quick=args.quick,
            budget=budget,
            timeouts=timeouts,
            on_result=_progress,
        )
        compare = mode == REAL and not args.no_compare
        if compare:
            _compare(results, steps, scratch, budget)
        meta = _meta(mode, argv, began_wall, seconds) | {"quick": args.quick, "compared": compare}
        meta["gpu"] = next((r.figures.get("gpu") for r in results if r.name == "driver"), None)
        write_json_atomic(args.out, report_dict(meta, results))
        _print(results, mode, compare, args.out, time.time() - began_wall)
        return 1 if any(r.status in BAD for r in results) else 0
    finally:
        if args.keep:
            print(f"gpu-check: scratch directory kept: {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def _real_gpu_problem(env: dict[str, str]) -> str | None:
    """Why this machine has no real GPU to check, or None (NVML from the system answers with a
    device, and it is not the simulated GPU's library)."""
    code = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "print(pynvml.nvmlDeviceGetCount())\n"
        "maps = [line.split()[-1] for line in open('/proc/self/maps') if 'libnvidia-ml.so' in line]\n"
        "print(maps[0] if maps else '-')\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired:
        return "NVML did not answer in 30 s"
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) < 2:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no NVIDIA GPU found here (NVML: {last}); --dry-run runs the steps on the simulated GPU"
    if Path(lines[1]).resolve().parent == (LIB_DIR / "simgpu").resolve():
        return "NVML resolves to the simulated GPU's library: take native/simgpu off LD_LIBRARY_PATH"
    if int(lines[0]) < 1:
        return "NVML reports no GPU; --dry-run runs the steps on the simulated GPU"
    return None


def _compare(results: list[StepResult], steps: list[Step], scratch: Path, budget: runner.Budget) -> None:
    """The driver-API steps again on a simulated GPU, quick: their figures beside the real ones."""
    wanted = {s.analog or s.name for s in steps} - {"suite"}
    sim_steps = [s for s in STEPS if s.name in wanted and not s.needs]
    env = simulated_environment(scratch / "sim")
    sim = {
        r.name: r
        for r in runner.run_steps(
            sim_steps, env, workdir=scratch, quick=True, budget=budget, timeouts={}, on_result=_progress
        )
    }
    for result in results:
        step = BY_NAME[result.name]
        other = sim.get(step.analog or step.name)
        if other is not None:
            result.simulated = {
                "source": other.source,
                "step": other.name,
                "status": other.status,
                "reason": other.reason,
                "summary": other.summary,
                "figures": other.figures,
            }


def _print(results: list[StepResult], mode: str, compare: bool, out: Path, took: float) -> None:
    gpu = next((r.figures.get("gpu") for r in results if r.name == "driver"), None) or {}
    what = "real GPU" if mode == REAL else "dry run, simulated GPU"
    name = f": {gpu.get('name')}, driver {gpu.get('driver_version')}" if gpu.get("name") else ""
    print(f"sharegpu gpu-check — {what}{name}")
    for line in table(results, compare):
        print(line)
    c = counts(results)
    tally = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in c.items() if n)
    print(f"{len(results)} steps: {tally}; {took:.0f} s; report: {out}")
