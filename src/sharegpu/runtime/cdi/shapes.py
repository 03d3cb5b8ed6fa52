"""vGPU shapes: a device named by what it gives, `gpu<idx>-<memory>-<compute>[-online|-offline][-cap|-burst]`.

`sharegpu.io/vgpu=gpu0-4GiB-30` is a 4 GiB vGPU with a 30% share of GPU 0; `-online`/`-offline`
set the priority (normal without), `-cap` and `-burst` the policy (`share` without; `burst` is
guaranteed its compute and may take the idle card). A container that asks for a shape gets a
tenant of its own, created by the CDI hook when the container is created and removed when it
stops, so two containers of one shape are two tenants.

The name in a spec is the canonical one (`format_size`: `4GiB`, `512MiB`, `1.5GiB`); a runtime
only resolves names the spec lists.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sharegpu.errors import CdiSpecError, SpecError
from sharegpu.spec import ComputeSpec, format_size, parse_memory_cap

_SHAPE = re.compile(
    r"^gpu(?P<gpu>0|[1-9][0-9]?)-(?P<memory>[0-9]+(?:\.[0-9]+)?[KMGT]i?B)-(?P<compute>[0-9]{1,3})"
    r"(?:-(?P<priority>online|offline))?(?:-(?P<policy>cap|burst))?$"
)
GRAMMAR = "gpu<index>-<memory>-<compute>[-online|-offline][-cap|-burst], like gpu0-4GiB-30"


@dataclass(frozen=True)
class Shape:
    gpu: int
    memory_bytes: int
    compute: ComputeSpec

    @property
    def name(self) -> str:
        parts = [f"gpu{self.gpu}", format_size(self.memory_bytes), str(self.compute.share_permille // 10)]
        if self.compute.priority != "normal":
            parts.append(self.compute.priority)
        if self.compute.policy != "share":
            parts.append(self.compute.policy)
        return "-".join(parts)


def parse_shape(name: str) -> Shape:
    """A shape from its name; CdiSpecError naming what is wrong."""
    match = _SHAPE.match(name)
    if not match:
        raise CdiSpecError(f"invalid vGPU shape {name!r}: use {GRAMMAR}")
    try:
        memory = parse_memory_cap(match["memory"])
        compute = ComputeSpec.parse(
            compute=match["compute"], policy=match["policy"], priority=match["priority"]
        )
    except SpecError as err:
        raise CdiSpecError(f"invalid vGPU shape {name!r}: {err}") from err
    return Shape(gpu=int(match["gpu"]), memory_bytes=memory, compute=compute)


def default_shapes(memory_by_gpu: Sequence[int]) -> list[Shape]:
    """A quarter of a GPU at 25%, half at 50%, all of it at 100%, for each GPU (by index)."""
    shapes = []
    for index, total in enumerate(memory_by_gpu):
        for part, pct in ((4, 25), (2, 50), (1, 100)):
            memory = total // part // (1 << 20) * (1 << 20)
            if memory:
                shapes.append(Shape(index, memory, ComputeSpec.parse(compute=str(pct))))
    return shapes
