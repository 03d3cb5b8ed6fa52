"""What a step sees and records: its target, its scale, its figures and checks.

Every figure and check is written to the step's result file at once (atomically), so a step
killed at its time limit still reports what it had measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpucheck.report import SKIPPED, Check, StepResult, write_json_atomic
from gpucheck.target import Target


class Skip(Exception):
    """Raised by a step that cannot run here; the message is the reason."""


class StepContext:
    def __init__(self, result: StepResult, target: Target, result_path: Path, quick: bool) -> None:
        self.result = result
        self.target = target
        self.path = result_path
        self.quick = quick
        self.flush()

    def scale(self, full: float, quick: float) -> float:
        """A duration or count: `quick` under --quick (the CI dry run), else `full`."""
        return quick if self.quick else full

    def figure(self, key: str, value: Any) -> Any:
        self.result.figures[key] = value
        self.flush()
        return value

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.result.checks.append(Check(name, bool(ok), detail))
        self.flush()
        return bool(ok)

    def summary(self, text: str) -> None:
        self.result.summary = text
        self.flush()

    def skip(self, reason: str) -> Skip:
        self.result.status = SKIPPED
        self.result.reason = reason
        self.flush()
        return Skip(reason)

    def flush(self) -> None:
        write_json_atomic(
            self.path, self.result.__dict__ | {"checks": [c.__dict__ for c in self.result.checks]}
        )
