"""Workload variants of a pod list, as the FGD paper evaluates them (Weng et al., ATC'23, §6).

A variant is derived from a base pod list by seeded, documented transformations, never by hand:

* ``pin<P>``: P% of the pods that ask for GPUs are pinned (``gpu_spec``) to one GPU model, drawn
  with the cluster's own model mix (each model weighted by its number of GPUs) among the models
  whose nodes could hold the pod when empty. ``pin<P>:<model>|<model>`` draws only from those.
* ``cpuonly<M>``: the number of pods without GPUs is M times the base list's (0 removes them,
  2 doubles them by drawing more, with replacement, from the base list's CPU-only pods).
* ``cpu<M>``: every pod's CPU request is multiplied by M (rounded to a milli-core).
* ``mem``: every GPU-sharing pod asks GPU memory as well (``with_gpu_memory``, the rule below).

Parts combine with ``+``: ``pin20+cpu2``. The transformations run in the order pin, cpuonly, cpu,
mem, each with its own generator derived from the seed, so that ``pin20`` and ``pin20+cpu2`` pin
the same pods. A spec that does not parse (a share over 100%, a negative multiplier, a model no
node has) is a SpecError with one line that says why.

GPU memory rule (``mem``): a pod with a fractional GPU of ``gpu_milli`` asks
``ceil(gpu_milli / 1000 x 16 GiB x u)`` rounded up to a whole GiB, with u drawn per pod uniformly
from [0.5, 1.5] (seeded): memory follows compute on a 16 GiB reference GPU (the trace's V100M16
and P100) with the spread of memory- and compute-bound jobs; at most the reference's 16 GiB.
Whole-GPU pods ask nothing extra (they hold their GPUs' memory). Nodes of models whose memory is
undisclosed (G1-G3) are given ``ASSUMED_GPU_MEMORY_MIB`` by ``with_assumed_memory``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sharegpu.errors import SpecError
from sharegpu.placement.model import FULL_GPU, Node, Request

REFERENCE_GPU_MEMORY_MIB = 16 * 1024
"""The GPU whose memory a fractional pod's compute share is read against (``mem``)."""
MEMORY_SPREAD = (0.5, 1.5)
"""Per-pod factor of memory against compute share, uniform (``mem``)."""
ASSUMED_GPU_MEMORY_MIB = {"G1": 24 * 1024, "G2": 32 * 1024, "G3": 80 * 1024}
"""Memory given to the trace's undisclosed models for the memory benchmark (an assumption)."""


@dataclass(frozen=True)
class VariantSpec:
    """What a variant changes in its base pod list (see the module docstring)."""

    text: str
    pin_share: float = 0.0
    pin_models: frozenset[str] = frozenset()
    """Models to pin to; empty: every model of the cluster."""
    cpu_only: float = 1.0
    cpu_demand: float = 1.0
    gpu_memory: bool = False


_PART = re.compile(r"^(pin|cpuonly|cpu)(-?[0-9]+(?:\.[0-9]+)?)(?::(.+))?$|^(mem)$")


def parse_variant(text: str, models: Sequence[str] = ()) -> VariantSpec:
    """``pin20+cpu2`` as a VariantSpec; ``models`` (the cluster's) checks pinned model names."""
    spec = VariantSpec(text=text)
    if not text.strip():
        raise SpecError("empty variant spec: expected e.g. pin20, cpuonly2, cpu1.5, mem or pin20+cpu2")
    seen: set[str] = set()
    for part in text.strip().split("+"):
        m = _PART.match(part.strip())
        if m is None:
            raise SpecError(
                f"variant {text!r}: cannot read {part!r} (expected pin<percent>[:<model>|...], "
                "cpuonly<multiplier>, cpu<multiplier> or mem)"
            )
        kind = m.group(1) or m.group(4)
        if kind in seen:
            raise SpecError(f"variant {text!r}: {kind} given twice")
        seen.add(kind)
        if kind == "mem":
            spec = replace(spec, gpu_memory=True)
            continue
        value = float(m.group(2))
        if m.group(3) and kind != "pin":
            raise SpecError(f"variant {text!r}: only pin takes a model list, not {kind}")
        if value < 0:
            raise SpecError(f"variant {text!r}: {kind} must not be negative, got {m.group(2)}")
        if kind == "pin":
            if value > 100:
                raise SpecError(f"variant {text!r}: cannot pin {m.group(2)}% of pods (at most 100%)")
            chosen = frozenset(x.strip() for x in (m.group(3) or "").split("|") if x.strip())
            unknown = sorted(chosen - set(models)) if models else []
            if unknown:
                raise SpecError(
                    f"variant {text!r}: no node has GPU model {', '.join(unknown)} "
                    f"(the cluster has: {', '.join(models)})"
                )
            spec = replace(spec, pin_share=value / 100, pin_models=chosen)
        elif kind == "cpuonly":
            spec = replace(spec, cpu_only=value)
        else:
            spec = replace(spec, cpu_demand=value)
    return spec


def cluster_models(nodes: Sequence[Node]) -> dict[str, int]:
    """GPU model -> number of GPUs of that model in the cluster (the trace's model mix)."""
    mix: dict[str, int] = {}
    for node in nodes:
        if node.gpus:
            mix[node.model] = mix.get(node.model, 0) + node.gpus
    return mix


def _holds(node: Node, pod: Request) -> bool:
    return (
        node.gpus >= pod.count
        and node.cpu_milli >= pod.cpu_milli
        and node.memory_mib >= pod.host_memory_mib
        and node.gpu_memory_mib >= pod.memory_mib
    )


def pin_models(
    pods: Sequence[Request],
    nodes: Sequence[Node],
    share: float,
    rng: np.random.Generator,
    allowed: frozenset[str] = frozenset(),
) -> list[Request]:
    """``share`` of the GPU pods pinned to one model each, drawn by the cluster's model mix among
    the models (of ``allowed``, if given) whose nodes could hold the pod empty."""
    mix = {m: g for m, g in cluster_models(nodes).items() if not allowed or m in allowed}
    out = list(pods)
    gpu_pods = [i for i, p in enumerate(pods) if p.count]
    picked: list[int] = list(rng.choice(len(gpu_pods), size=round(share * len(gpu_pods)), replace=False))
    chosen = [gpu_pods[int(k)] for k in picked]
    fits: dict[tuple[object, ...], list[str]] = {}
    for i in sorted(chosen):
        pod = pods[i]
        key = pod.shape
        if key not in fits:
            fits[key] = [
                m
                for m in mix
                if (not pod.models or m in pod.models) and any(n.model == m and _holds(n, pod) for n in nodes)
            ]
        options = fits[key]
        if not options:
            continue
        weights = np.array([mix[m] for m in options], dtype=np.float64)
        model = options[int(rng.choice(len(options), p=weights / weights.sum()))]
        out[i] = replace(pod, models=frozenset({model}))
    return out


def scale_cpu_only(pods: Sequence[Request], factor: float, rng: np.random.Generator) -> list[Request]:
    """The pods without GPUs, ``factor`` times as many (drawn from the base's own CPU-only pods)."""
    gpu = [p for p in pods if p.count]
    cpu_only = [p for p in pods if not p.count]
    want = round(factor * len(cpu_only))
    if want <= len(cpu_only):
        keep = sorted(int(i) for i in rng.choice(len(cpu_only), size=want, replace=False))
        extra = [cpu_only[i] for i in keep]
    else:
        drawn = rng.integers(len(cpu_only), size=want - len(cpu_only))
        extra = cpu_only + [
            replace(cpu_only[int(i)], name=f"{cpu_only[int(i)].name}-x{k}") for k, i in enumerate(drawn)
        ]
    return gpu + extra


def scale_cpu(pods: Sequence[Request], factor: float) -> list[Request]:
    return [replace(p, cpu_milli=round(p.cpu_milli * factor)) for p in pods]


def with_gpu_memory(pods: Sequence[Request], rng: np.random.Generator) -> list[Request]:
    """GPU-sharing pods ask GPU memory by the documented rule (module docstring)."""
    out: list[Request] = []
    lo, hi = MEMORY_SPREAD
    for pod in pods:
        if pod.count and pod.compute_milli < FULL_GPU and not pod.memory_mib:
            u = rng.uniform(lo, hi)
            mib = min(REFERENCE_GPU_MEMORY_MIB, pod.compute_milli / FULL_GPU * REFERENCE_GPU_MEMORY_MIB * u)
            out.append(replace(pod, memory_mib=max(1, math.ceil(mib / 1024)) * 1024))
        else:
            out.append(pod)
    return out


def with_assumed_memory(nodes: Sequence[Node]) -> list[Node]:
    """Nodes of undisclosed models (no GPU memory known) given ASSUMED_GPU_MEMORY_MIB."""
    return [
        replace(n, gpu_memory_mib=ASSUMED_GPU_MEMORY_MIB.get(n.model, 0))
        if n.gpus and not n.gpu_memory_mib
        else n
        for n in nodes
    ]


def make_variant(
    pods: Sequence[Request], nodes: Sequence[Node], spec: VariantSpec | str, seed: int = 0
) -> list[Request]:
    """The pod list of a variant of ``pods`` on ``nodes``; the same seed gives the same list."""
    if isinstance(spec, str):
        spec = parse_variant(spec, sorted(cluster_models(nodes)))
    out = list(pods)
    if spec.pin_share:
        out = pin_models(out, nodes, spec.pin_share, np.random.default_rng([seed, 1]), spec.pin_models)
    if spec.cpu_only != 1.0:
        out = scale_cpu_only(out, spec.cpu_only, np.random.default_rng([seed, 2]))
    if spec.cpu_demand != 1.0:
        out = scale_cpu(out, spec.cpu_demand)
    if spec.gpu_memory:
        out = with_gpu_memory(out, np.random.default_rng([seed, 3]))
    return out
