"""Workload variants (sharegpu.sim.variants), QoS classes and colocation (sharegpu.sim) on the
shipped Alibaba trace and on small hand-made inputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sharegpu.placement import Node, Request
from sharegpu.sim import load_nodes, load_pods
from sharegpu.sim.trace import LoadReport, screen_pods
from sharegpu.sim.variants import (
    make_variant,
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


def test_bench_rejects_a_malformed_variant_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "placement.py"), "--variants", "pin150"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "at most 100%" in out.stderr


def test_bench_variants_script_writes_what_the_benchmark_replays(
    tmp_path: Path, cluster: list[Node], pods: list[Request]
) -> None:
    script = str(REPO / "bench" / "variants.py")
    subprocess.run(
        [sys.executable, script, "--out", str(tmp_path), "pin10+cpu1.5", "--seed", "3"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    written, report = load_pods(tmp_path / "openb_pod_list_pin10+cpu1.5.csv", cluster)
    # 1.5x the CPU of the largest pods is more than any node has: skipped on load, as the bench does.
    assert set(report.skipped) == {"impossible request"}
    made = make_variant(pods, cluster, "pin10+cpu1.5", seed=3)
    expected = screen_pods(enumerate(made), cluster, LoadReport("variant"))
    assert [p.shape for p in written] == [p.shape for p in expected]
    # bench/placement.py --variants pin10+cpu1.5 --variant-seed 3 replays the same pods.
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import placement
    finally:
        sys.path.remove(str(REPO / "bench"))
    _, replayed = placement._load(str(DATA), "variant:pin10+cpu1.5#3")
    assert [p.shape for p in replayed] == [p.shape for p in written]
    _, seed0 = placement._load(str(DATA), "variant:pin10+cpu1.5")
    assert [p.shape for p in seed0] != [p.shape for p in written]


def test_bench_variants_script_rejects_a_bad_spec_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "variants.py"), "--out", str(tmp_path), "pin20:H100"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "bench/variants.py: variant 'pin20:H100': no node has GPU model H100 "
        "(the cluster has: A10, G2, G3, P100, T4, V100M16, V100M32)"
    )
