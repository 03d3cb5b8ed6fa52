"""Runs the steps, each in a child process bounded in time, and collects their results.

A step's process runs in a session of its own; at its time limit the whole session is killed
(SIGTERM, then SIGKILL a moment later), so a hung CUDA call, a program that never exits or a
`sharegpu run` child cannot outlive it. What the step wrote before is kept and its status is
`timed_out`. The run has a budget: a step never gets more than what is left of it, and a step
that would start after it is spent is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpucheck.report import ERROR, SKIPPED, TIMED_OUT, StepResult
from gpucheck.steps import Step
from gpucheck.target import LABELS, SIMULATED

LOG_TAIL = 3000  # characters of a step's log kept in the report when it did not pass


@dataclass
class Budget:
    seconds: float
    began: float

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.began)


def runtime_reason(step: Step) -> str:
    return (
        f"needs {step.needs}, which cannot run on the simulated GPU: the CUDA runtime relies on "
        "the driver's undocumented export tables (cuGetExportTable), which the simulated driver "
        "does not have; runs on a real GPU"
    )


def _kill_session(proc: subprocess.Popen[bytes], gently: bool) -> None:
    """End every process of the step's session: SIGTERM first when it overran (a program may
    clean up), then SIGKILL to whatever is left, the leader finished or not."""
    if gently:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=3)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_step(
    step: Step,
    env: dict[str, str],
    workdir: Path,
    quick: bool,
    timeout: float,
) -> StepResult:
    """One step on the target whose environment is `env`, killed after `timeout` seconds."""
    kind = env.get("GPUCHECK_TARGET", SIMULATED)
    result_path = workdir / "results" / f"{step.name}.{kind}.json"
    log_path = workdir / "logs" / f"{step.name}.{kind}.log"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.unlink(missing_ok=True)
    if kind == SIMULATED and step.needs:
        return StepResult(step.name, step.title, LABELS[kind], status=SKIPPED, reason=runtime_reason(step))
    cmd = [sys.executable, "-m", "gpucheck.stepproc", "--step", step.name, "--result", str(result_path)]
    if quick:
        cmd.append("--quick")
    began = time.monotonic()
    timed_out = False
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_session(proc, gently=timed_out)
    took = time.monotonic() - began
    result = _read(result_path, step, kind)
    result.timeout_s = round(timeout, 1)
    if timed_out:
        result.status = TIMED_OUT
        result.reason = f"killed at its time limit of {timeout:.0f} s" + (
            f" (it had got as far as: {result.summary})" if result.summary else ""
        )
    elif result.status in ("", ERROR) and proc.returncode != 0:
        result.status = ERROR
        result.reason = f"the step's process exited with status {proc.returncode}: {_last_line(log_path)}"
    elif result.status == "":
        result.status = ERROR
        result.reason = "the step's process ended before the step did"
    result.duration_s = round(took, 2)
    if result.status not in ("passed", SKIPPED):
        result.log_tail = _tail(log_path)
    return result


def _read(path: Path, step: Step, kind: str) -> StepResult:
    try:
        return StepResult.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return StepResult(step.name, step.title, LABELS[kind], status="")


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-LOG_TAIL:]
    except OSError:
        return ""
    return data.decode(errors="replace")


def _last_line(path: Path) -> str:
    lines = [line for line in _tail(path).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


SNAPSHOT = """
import json, sys
from pathlib import Path
from gpucheck.report import write_json_atomic
from gpucheck.steps.settings import BEFORE, snapshot
write_json_atomic(Path(sys.argv[1]) / BEFORE, snapshot())
"""


def take_snapshot(env: dict[str, str]) -> str | None:
    """The GPU's settings before the steps, for the `settings` step; why not, or None."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SNAPSHOT, env["GPUCHECK_ROOT"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "NVML did not answer in 30 s"
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["failed"])[-1]


def run_steps(
    steps: list[Step],
    env: dict[str, str],
    *,
    workdir: Path,
    quick: bool,
    budget: Budget,
    timeouts: dict[str, float],
    on_result: Callable[[StepResult], None],
) -> list[StepResult]:
    results = []
    real = env.get("GPUCHECK_TARGET") != SIMULATED
    if any(s.name == "settings" for s in steps):
        problem = take_snapshot(env)
        if problem:
            print(
                f"gpu-check: the GPU's settings could not be read before the steps: {problem}",
                file=sys.stderr,
            )
    hung: dict[str, str] = {}  # a runtime whose program ran past its limit: by the step that saw it
    for step in steps:
        limit = timeouts.get(step.name, step.timeout_s if real else step.dry_timeout_s)
        left = budget.left()
        if step.needs and step.needs in hung:
            result = StepResult(
                step.name,
                step.title,
                LABELS["real" if real else SIMULATED],
                status=SKIPPED,
                reason=f"not tried: {hung[step.needs]} ran past its time limit with {step.needs}",
            )
        elif left < 5 and not (not real and step.needs):
            result = StepResult(
                step.name,
                step.title,
                LABELS["real" if real else SIMULATED],
                status=SKIPPED,
                reason=f"the run's time budget ({budget.seconds:.0f} s) was spent before this step",
            )
        else:
            result = run_step(step, env, workdir, quick, min(limit, left))
            if result.status == TIMED_OUT and step.needs:
                hung[step.needs] = step.name
        results.append(result)
        on_result(result)
    return results
