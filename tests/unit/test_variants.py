"""Workload variants (sharegpu.sim.variants), QoS classes and colocation (sharegpu.sim) on the
shipped Alibaba trace and on small hand-made inputs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sharegpu.errors import SpecError
from sharegpu.placement import ClusterState, Node, Placement, Priority, Request
from sharegpu.sim import load_nodes, load_pods
from sharegpu.sim.colocation import colocation
from sharegpu.sim.trace import parse_pod
from sharegpu.sim.variants import (
    REFERENCE_GPU_MEMORY_MIB,
    cluster_models,
    make_variant,
    parse_variant,
    with_assumed_memory,
)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "alibaba-gpu-v2023"


@pytest.fixture(scope="module")
def cluster() -> list[Node]:
    nodes, _ = load_nodes(DATA / "openb_node_list_all_node.csv")
    return nodes


@pytest.fixture(scope="module")
def pods(cluster: list[Node]) -> list[Request]:
    pods, _ = load_pods(DATA / "openb_pod_list_default.csv", cluster)
    return pods


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        pytest.param("pin120", "at most 100%", id="share-over-100"),
        pytest.param("cpu-1", "must not be negative", id="negative-multiplier"),
        pytest.param("cpuonly-0.5", "must not be negative", id="negative-cpu-only"),
        pytest.param("pin20:H100", "no node has GPU model H100", id="unknown-model"),
        pytest.param("pin20+pin10", "given twice", id="twice"),
        pytest.param("gpus2", "cannot read", id="unknown-part"),
        pytest.param("cpu2:T4", "only pin takes a model list", id="models-on-cpu"),
        pytest.param("", "empty variant", id="empty"),
    ],
)
def test_malformed_variant_specs_are_one_line_errors(spec: str, text: str) -> None:
    with pytest.raises(SpecError, match=text) as err:
        parse_variant(spec, ["G2", "T4"])
    assert "\n" not in str(err.value)


def test_variant_spec_parses_its_parts() -> None:
    spec = parse_variant("pin20:T4|G2+cpuonly2+cpu1.5+mem", ["G2", "T4"])
    assert (spec.pin_share, spec.pin_models, spec.cpu_only, spec.cpu_demand, spec.gpu_memory) == (
        0.2, frozenset({"T4", "G2"}), 2.0, 1.5, True,
    )  # fmt: skip


def test_pins_follow_the_cluster_model_mix(cluster: list[Node], pods: list[Request]) -> None:
    variant = make_variant(pods, cluster, "pin33", seed=0)
    assert variant == make_variant(pods, cluster, "pin33", seed=0)
    assert variant != make_variant(pods, cluster, "pin33", seed=1)
    gpu = [p for p in variant if p.count]
    pinned = [p for p in gpu if p.models]
    assert len(pinned) / len(gpu) == pytest.approx(0.33, abs=0.01)
    assert all(len(p.models) == 1 for p in pinned)
    mix = cluster_models(cluster)
    got = Counter(next(iter(p.models)) for p in pinned)
    # G2 holds 71% of the GPUs; only pods that no G2 node could hold go elsewhere.
    assert got["G2"] / len(pinned) == pytest.approx(mix["G2"] / sum(mix.values()), abs=0.05)
    # The same pods are pinned whatever else the variant changes.
    mixed = make_variant(pods, cluster, "pin33+cpu2", seed=0)
    assert [p.models for p in mixed if p.count] == [p.models for p in gpu]


def test_cpu_only_share_and_cpu_demand(cluster: list[Node], pods: list[Request]) -> None:
    cpu_only = sum(1 for p in pods if not p.count)
    assert not any(not p.count for p in make_variant(pods, cluster, "cpuonly0"))
    assert sum(1 for p in make_variant(pods, cluster, "cpuonly2") if not p.count) == 2 * cpu_only
    doubled = make_variant(pods, cluster, "cpu2")
    assert [p.cpu_milli for p in doubled] == [2 * p.cpu_milli for p in pods]


def test_memory_rule(cluster: list[Node], pods: list[Request]) -> None:
    variant = make_variant(pods, cluster, "mem", seed=0)
    for before, after in zip(pods, variant, strict=True):
        if before.count and before.compute_milli < 1000:
            share = before.compute_milli / 1000
            assert after.memory_mib % 1024 == 0
            assert max(1024, 0.5 * share * REFERENCE_GPU_MEMORY_MIB - 1024) <= after.memory_mib
            assert after.memory_mib <= min(
                REFERENCE_GPU_MEMORY_MIB, 1.5 * share * REFERENCE_GPU_MEMORY_MIB + 1024
            )
        else:
            assert after.memory_mib == before.memory_mib
    nodes = with_assumed_memory(cluster)
    assert all(n.gpu_memory_mib > 0 for n in nodes if n.gpus)


@pytest.mark.parametrize(
    ("qos", "priority"),
    [("LS", Priority.online), ("Guaranteed", Priority.online), ("Burstable", Priority.normal),
     ("BE", Priority.offline)],
)  # fmt: skip
def test_qos_classes_map_to_priorities(qos: str, priority: Priority) -> None:
    row = {
        "name": "p",
        "cpu_milli": "1000",
        "memory_mib": "1024",
        "num_gpu": "1",
        "gpu_milli": "500",
        "qos": qos,
    }
    assert parse_pod(row, 2, qos=True).priority is priority
    assert parse_pod(row, 2).priority is Priority.normal  # only when asked for
    assert parse_pod(row | {"priority": "offline"}, 2, qos=True).priority is Priority.offline


def test_unknown_qos_class_is_a_malformed_row() -> None:
    row = {"name": "p", "cpu_milli": "1", "memory_mib": "1", "num_gpu": "0", "gpu_milli": "0", "qos": "Gold"}
    with pytest.raises(ValueError, match="qos='Gold'"):
        parse_pod(row, 2, qos=True)


def test_colocation_counts_online_next_to_offline() -> None:
    node = Node("n", cpu_milli=64000, memory_mib=1 << 18, gpus=2, model="T4", gpu_memory_mib=15360)
    state = ClusterState([node])
    for gpu, priority in (
        (0, Priority.online),
        (0, Priority.offline),
        (1, Priority.online),
        (1, Priority.online),
    ):
        state.allocate(Placement("n", 0, (gpu,)), Request(compute_milli=300, priority=priority))
    got = colocation(state)
    assert (got.gpus_in_use, got.online_gpus, got.mixed_gpus) == (2, 2, 1)
    assert (got.online_pods, got.online_pods_sharing) == (3, 2)
    assert got.mixed_share == 0.5
