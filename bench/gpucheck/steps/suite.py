"""The suite's real-GPU tests: `pytest -m realgpu` over the test files that have them.

On a real GPU they run with SHAREGPU_REAL_GPU=1, which makes a failed GPU detection an error
instead of a deselection. Elsewhere pytest deselects them and says so in one summary line
(tests/conftest.py); this step then reports them as not run, with pytest's own reason, and
fails if pytest did not say it (a silent skip).
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET

from gpucheck.context import StepContext
from gpucheck.target import REPO

NOT_RUN = re.compile(r"realgpu: (\d+) real-GPU tests? not run: (.*)")


def test_files() -> list[str]:
    return sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("test_*.py")
        if "pytest.mark.realgpu" in p.read_text(errors="replace")
    )


def run(ctx: StepContext) -> None:
    files = ctx.figure("files", test_files())
    if not files:
        raise ctx.skip("no test is marked realgpu")
    junit = ctx.target.scratch("suite") / "junit.xml"
    env = ctx.target.env | ({"SHAREGPU_REAL_GPU": "1"} if ctx.target.real else {"SHAREGPU_REAL_GPU": "0"})
    cmd = [ctx.target.python, "-m", "pytest", "-q", "-m", "realgpu", "-p", "no:cacheprovider"]
    cmd += ["--junitxml", str(junit), *files]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    print(out)
    ctx.figure("pytest_rc", proc.returncode)
    ctx.figure("pytest_last_line", (out.strip().splitlines() or [""])[-1])
    tally = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        if suite.tag != "testsuite":
            suite = next(iter(suite.iter("testsuite")), suite)
        tally = {k: int(suite.get(k, 0)) for k in tally}
        failed = [
            f"{case.get('classname')}.{case.get('name')}"
            for case in suite.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None
        ]
        ctx.figure("failed_tests", failed)
    ctx.figure("junit", tally)
    match = NOT_RUN.search(out)
    if match:
        ctx.figure("not_run", {"count": int(match.group(1)), "reason": match.group(2).strip()})
    passed = tally["tests"] - tally["failures"] - tally["errors"] - tally["skipped"]
    if ctx.target.real:
        ctx.check("pytest exited 0", proc.returncode == 0, f"rc {proc.returncode}")
        ctx.check("every real-GPU test ran", passed > 0 and not match, f"{passed} passed, {tally}")
        ctx.summary(
            f"{passed} passed, {tally['failures'] + tally['errors']} failed, {tally['skipped']} skipped"
        )
        return
    # No GPU: pytest must deselect them (rc 5: nothing collected is fine) and say so.
    ctx.check("pytest ran none of them and did not fail", proc.returncode in (0, 5) and tally["tests"] == 0)
    if not ctx.check("pytest reported the real-GPU tests it did not run", match is not None, "a silent skip"):
        return
    assert match is not None
    ctx.summary(f"{match.group(1)} real-GPU tests reported not run")
    raise ctx.skip(f"pytest: {match.group(1)} real-GPU tests not run: {match.group(2).strip()}")
