"""Reading node and pod lists (the Alibaba cluster-trace-gpu-v2023 "openb" CSV format).

Nodes: ``sn,cpu_milli,memory_mib,gpu,model`` and optionally ``gpu_memory_mib`` and ``topology``
(``nvlink:0,1,2,3|4,5,6,7 pcie:0,1|2,3``). Pods: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli``
and optionally ``gpu_spec`` (allowed models, ``|``-separated), ``gpu_memory_mib`` and
``priority`` (online, normal, offline); other columns are ignored.

A row that cannot be used is skipped and counted, with its line number and why, and the load
goes on; a file that is missing or lacks a required column is an error.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu.errors import ConfigError, SpecError
from sharegpu.placement.candidates import candidates
from sharegpu.placement.cluster import ClusterState
from sharegpu.placement.engine import explain
from sharegpu.placement.model import FULL_GPU, Node, NoFitReason, Priority, Request, Topology

GPU_MEMORY_MIB = {
    "P100": 16 * 1024,
    "T4": 15 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
    "A10": 24 * 1024,
    "A100": 80 * 1024,
    "H100": 80 * 1024,
}
"""Memory per GPU of the models the trace names, where it is public (G1-G3 are undisclosed)."""

QOS_CLASSES = ("LS", "Guaranteed", "Burstable", "BE")
QOS_PRIORITY = {
    "ls": Priority.online,  # latency-sensitive: serving, spread away from other online pods
    "guaranteed": Priority.online,  # reserved resources: treated as latency-sensitive
    "burstable": Priority.normal,
    "be": Priority.offline,  # best effort: packs into gaps, evicted first
}
"""The trace's qos classes as sharegpu priorities (used with ``qos=True``)."""

NODE_COLUMNS = ("cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
MAX_EXAMPLES = 5


@dataclass
class LoadReport:
    """What a load kept and what it skipped, by reason, with the first few examples."""

    path: str
    rows: int = 0
    loaded: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def skip(self, line: int, reason: str, detail: str) -> None:
        self.skipped[reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{self.path}:{line}: {reason}: {detail}")

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "rows": self.rows,
            "loaded": self.loaded,
            "skipped": dict(self.skipped),
            "examples": list(self.examples),
        }


def _rows(
    path: Path, required: tuple[str, ...], name_columns: tuple[str, ...]
) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if not any(c in header for c in name_columns):
            missing.insert(0, "/".join(name_columns))
        if missing:
            raise ConfigError(
                f"{path}: missing column(s) {', '.join(missing)} (has: {', '.join(header) or 'nothing'})"
            )
        for row in reader:
            yield reader.line_num, row


def _int(row: dict[str, str], column: str, default: int | None = None) -> int:
    text = (row.get(column) or "").strip()
    if not text:
        if default is not None:
            return default
        raise ValueError(f"{column} is empty")
    try:
        value = int(text)
    except ValueError:
        try:
            as_float = float(text)
        except ValueError:
            raise ValueError(f"{column}={text!r} is not a number") from None
        if not as_float.is_integer():
            raise ValueError(f"{column}={text!r} is not a whole number") from None
        value = int(as_float)
    if value < 0:
        raise ValueError(f"{column}={value} is negative")
    return value


def _name(row: dict[str, str], columns: tuple[str, ...], line: int) -> str:
    for column in columns:
        if row.get(column):
            return row[column].strip()
    return f"line-{line}"


def load_nodes(path: Path) -> tuple[list[Node], LoadReport]:
    report = LoadReport(str(path))
    nodes: list[Node] = []
    names: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS, ("sn", "name")):
        report.rows += 1
        name = _name(row, ("sn", "name"), line)
        try:
            gpus = _int(row, "gpu")
            model = (row.get("model") or "").strip()
            memory = _int(row, "gpu_memory_mib", GPU_MEMORY_MIB.get(model.upper(), 0))
            topo_text = (row.get("topology") or "").strip()
            topology = Topology.parse(gpus, topo_text) if topo_text else None
            if name in names:
                raise ValueError(f"node {name} appears twice")
            node = Node(
                name=name,
                cpu_milli=_int(row, "cpu_milli"),
                memory_mib=_int(row, "memory_mib"),
                gpus=gpus,
                model=model if gpus else "",
                gpu_memory_mib=memory if gpus else 0,
                topology=topology,
            )
        except (ValueError, SpecError) as err:
            report.skip(line, "malformed row", str(err))
            continue
        names.add(name)
        nodes.append(node)
        report.loaded += 1
    if not nodes:
        raise ConfigError(f"{path}: no usable node ({report.skipped_total} rows skipped)")
    return nodes, report


def parse_pod(row: dict[str, str], line: int, *, qos: bool = False) -> Request:
    """One pod row as a Request; ValueError or SpecError for a malformed row. With ``qos`` a row
    without a ``priority`` takes its priority from its ``qos`` class (QOS_PRIORITY)."""
    count = _int(row, "num_gpu")
    milli = _int(row, "gpu_milli", 0)
    if count and not 0 < milli <= FULL_GPU:
        raise ValueError(f"gpu_milli={milli} must be 1..{FULL_GPU} for a pod with GPUs")
    spec = (row.get("gpu_spec") or "").strip()
    models = frozenset(m.strip() for m in spec.split("|") if m.strip())
    priority_text = (row.get("priority") or "").strip().lower()
    qos_text = (row.get("qos") or "").strip()
    if not priority_text and qos and qos_text:
        if qos_text.lower() not in QOS_PRIORITY:
            raise ValueError(f"qos={qos_text!r} is not one of {', '.join(QOS_CLASSES)}")
        priority_text = QOS_PRIORITY[qos_text.lower()].value
    priority_text = priority_text or "normal"
    try:
        priority = Priority(priority_text)
    except ValueError:
        raise ValueError(f"priority={priority_text!r} is not online, normal or offline") from None
    return Request(
        count=count,
        compute_milli=milli if count else FULL_GPU,
        memory_mib=_int(row, "gpu_memory_mib", 0) if count else 0,
        cpu_milli=_int(row, "cpu_milli"),
        host_memory_mib=_int(row, "memory_mib"),
        models=models if count else frozenset(),
        priority=priority,
        name=_name(row, ("name",), line),
    )


def load_pods(path: Path, nodes: list[Node], *, qos: bool = False) -> tuple[list[Request], LoadReport]:
    """Pods that are well formed and could run on some node of ``nodes`` when it is empty.

    Skipped, and counted: malformed rows, pods asking for a GPU model no node has, and pods no
    node could hold even empty (an impossible request would only ever be pending). With ``qos``
    a row without a ``priority`` takes it from its ``qos`` class (QOS_PRIORITY).
    """
    report = LoadReport(str(path))
    parsed: list[tuple[int, Request]] = []
    for line, row in _rows(path, POD_COLUMNS, ("name",)):
        report.rows += 1
        try:
            parsed.append((line, parse_pod(row, line, qos=qos)))
        except (ValueError, SpecError) as err:
            report.skip(line, "malformed row", str(err))
    pods = screen_pods(parsed, nodes, report)
    if not pods:
        raise ConfigError(f"{path}: no usable pod ({report.skipped_total} rows skipped)")
    return pods, report


def screen_pods(pods: Iterable[tuple[int, Request]], nodes: list[Node], report: LoadReport) -> list[Request]:
    """The pods (with their line numbers) that some node of ``nodes`` could hold when empty; the
    others are counted in ``report``: an unknown GPU model, or an impossible request."""
    empty = ClusterState(nodes)
    verdicts: dict[tuple[object, ...], str | None] = {}
    kept: list[Request] = []
    for line, pod in pods:
        if pod.shape not in verdicts:
            no_fit = None if len(candidates(empty, pod)) else explain(empty, pod)
            verdicts[pod.shape] = None
            if no_fit is not None and no_fit.reason is NoFitReason.no_such_model:
                verdicts[pod.shape] = "unknown GPU model: " + no_fit.message
            elif no_fit is not None:
                verdicts[pod.shape] = "impossible request: " + no_fit.message
        verdict = verdicts[pod.shape]
        if verdict is not None:
            reason, _, detail = verdict.partition(": ")
            report.skip(line, reason, f"pod {pod.name}: {detail}")
            continue
        kept.append(pod)
        report.loaded += 1
    return kept
