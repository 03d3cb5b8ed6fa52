"""The results of a run: one JSON file and one printed table.

A step's result is its status, the figures it measured (named, with units in the name), the
checks it made (each a claim and whether it held), one summary line and, on a real GPU, the
same step's figures on the simulated GPU for comparison. Status:

  passed     every check held
  failed     a check did not hold
  skipped    not run, with the reason (a CUDA-runtime program on the simulated GPU, a tool
             the machine lacks, the run's time budget spent)
  timed_out  the step ran past its time limit and was killed; what it had measured is kept
  error      the step could not run to its end (the reason says why)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
PASSED, FAILED, SKIPPED, TIMED_OUT, ERROR = "passed", "failed", "skipped", "timed_out", "error"
STATUSES = (PASSED, FAILED, SKIPPED, TIMED_OUT, ERROR)
BAD = (FAILED, TIMED_OUT, ERROR)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class StepResult:
    name: str
    title: str
    source: str  # "real GPU" or "simulated GPU": where the figures come from
    status: str = ERROR
    reason: str = ""
    summary: str = ""
    duration_s: float = 0.0
    timeout_s: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    # On a real GPU: {"source": "simulated GPU", "step": name, "summary": ..., "figures": {...}}
    simulated: dict[str, Any] | None = None
    log_tail: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        checks = [Check(**c) for c in data.get("checks", [])]
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "checks"}
        return cls(**known, checks=checks)

    def judge(self) -> None:
        """passed / failed from the checks, unless the step was skipped or broke off."""
        if self.status in (SKIPPED, TIMED_OUT, ERROR):
            return
        failed = [c.name for c in self.checks if not c.ok]
        self.status = FAILED if failed else PASSED
        if failed and not self.reason:
            self.reason = "did not hold: " + "; ".join(failed)


def write_json_atomic(path: Path, data: object) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def counts(results: Iterable[StepResult]) -> dict[str, int]:
    found = dict.fromkeys(STATUSES, 0)
    for r in results:
        found[r.status] = found.get(r.status, 0) + 1
    return found


def report_dict(meta: dict[str, Any], results: list[StepResult]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        **meta,
        "summary": counts(results),
        "steps": [asdict(r) for r in results],
    }


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(results: list[StepResult], compare: bool) -> list[str]:
    """One line per step: name, status, what it measured (where), the simulated figure beside it
    on a real GPU, and its time. The reason of a step that did not pass goes under it."""
    source = results[0].source if results else ""
    head = ["step", "status", source or "figures"]
    widths = [18, 9, 64]
    if compare:
        head.append("simulated GPU")
        widths.append(44)
    head.append("time")
    widths.append(7)
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for r in results:
        cells = [r.name, r.status, _clip(r.summary, widths[2])]
        if compare:
            sim = r.simulated or {}
            label = sim.get("summary", "")
            if sim and sim.get("step") != r.name:
                label = f"({sim.get('step')}) {label}"
            cells.append(_clip(label or "—", widths[3]))
        cells.append(f"{r.duration_s:.1f}s")
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        if r.status != PASSED and r.reason:
            lines.append(" " * 20 + "↳ " + _clip(r.reason, sum(widths) - 22))
    return lines
