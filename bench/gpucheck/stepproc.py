"""One step in a process of its own: `python -m gpucheck.stepproc --step NAME --result FILE`.

Started by the runner with the target's environment, in a session of its own so that the
runner can kill it and everything it started at the step's time limit. The result file is
rewritten after every figure and check (see context.py); a traceback goes to the step's log.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from gpucheck.context import Skip, StepContext
from gpucheck.report import ERROR, StepResult
from gpucheck.steps import BY_NAME
from gpucheck.target import Target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--step", required=True, choices=sorted(BY_NAME))
    ap.add_argument("--result", required=True, type=Path)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    step = BY_NAME[args.step]
    target = Target.current()
    result = StepResult(
        step.name,
        step.title,
        target.label,
        status=ERROR,
        reason="the step's process ended before the step did",
    )
    ctx = StepContext(result, target, args.result, args.quick)
    began = time.monotonic()
    try:
        result.status, result.reason = "", ""
        step.function()(ctx)
    except Skip:
        pass
    except Exception as err:
        traceback.print_exc()
        result.status = ERROR
        result.reason = f"{type(err).__name__}: {err}"
    result.duration_s = round(time.monotonic() - began, 2)
    result.judge()
    ctx.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
