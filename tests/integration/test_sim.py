"""sharegpu.sim and `sharegpu simulate` on the real Alibaba trace and on small bad inputs.

The trace ships in the repository at data/alibaba-gpu-v2023 (see its README for source and
citation). Without it these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sharegpu.placement import Node, Request, policies
from sharegpu.placement.cluster import ClusterState
from sharegpu.sim import simulate


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,4,V100M16
n1,32000,131072,2,T4
n2,64000,262144,0,
"""

PODS_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
ok-whole,4000,8192,1,1000,
ok-half,2000,4096,1,500,V100M16|T4
ok-cpu,8000,8192,0,0,
bad-number,4000,lots,1,1000,
bad-milli,4000,8192,1,1500,
bad-negative,-4000,8192,1,1000,
unknown-model,4000,8192,1,1000,H100
too-many-gpus,4000,8192,8,1000,
too-much-cpu,128000,8192,1,1000,
"""


def test_simulation_is_deterministic_by_seed(small_cluster: list[Node], default_pods: list[Request]) -> None:
    a = simulate(small_cluster, default_pods, "random", 42)
    b = simulate(small_cluster, default_pods, "random", 42)
    c = simulate(small_cluster, default_pods, "random", 43)
    assert a.points == b.points
    assert a.points != c.points
    assert [p.demand for p in a.points][:3] == [0.0, 0.01, 0.02]
    assert a.points[-1].demand == pytest.approx(1.3)


def test_tidying_other_shapes_gradients_keeps_every_decision_and_bounds_the_catch_up(
    small_cluster: list[Node], default_pods: list[Request], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each decision also brings a few stale nodes of the shape longest without a look up to
    date: the same placements as without, and a rare shape no longer pays for every node that
    changed since it last came."""
    caught_up: list[int] = []
    refresh = policies._GradientCache.refresh

    def counting(self: policies._GradientCache, state: ClusterState, limit: int | None = None) -> bool:
        if limit is None:
            caught_up.append(int(np.count_nonzero((self.seen != state.version) & self.eligible)))
        return refresh(self, state, limit)

    monkeypatch.setattr(policies._GradientCache, "refresh", counting)
    first_looks = len({r.shape for r in default_pods})  # warm(): every shape's first, whole look
    tidy = simulate(small_cluster, default_pods, "ours", 42)
    worst_tidy = max(caught_up[first_looks:])
    caught_up.clear()
    monkeypatch.setattr(policies, "TIDY_NODES", 0)
    lazy = simulate(small_cluster, default_pods, "ours", 42)
    worst_lazy = max(caught_up[first_looks:])
    assert tidy.points == lazy.points
    assert tidy.failed_pods == lazy.failed_pods
    print(f"most stale nodes one decision caught up: {worst_tidy} with tidying, {worst_lazy} without")
    assert worst_tidy < worst_lazy / 2


def test_reduced_reproduction_fgd_beats_random_and_ours_beats_fgd(
    small_cluster: list[Node], default_pods: list[Request]
) -> None:
    """A quarter of the cluster, two seeds: the ordering of the full benchmark holds."""
    for seed in (42, 43):
        got = {
            p: simulate(small_cluster, default_pods, p, seed).at(1.0).allocation_ratio
            for p in ("random", "fgd", "ours")
        }
        assert got["fgd"] > got["random"] + 0.05, got
        assert got["ours"] >= got["fgd"], got


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_simulate_json_end_to_end(tmp_path: Path) -> None:
    nodes = _write(tmp_path / "nodes.csv", NODES_CSV)
    pods = _write(tmp_path / "pods.csv", PODS_CSV)
    plot = tmp_path / "alloc.png"
    proc = _cli("--trace", str(pods), "--nodes", str(nodes), "-p", "fgd", "-p", "ours", "--seed", "3",
                "--plot", str(plot), "-o", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["version"] == 1
    assert doc["kind"] == "Simulation"
    assert [r["policy"] for r in doc["items"]] == ["fgd", "sharegpu"]
    first = doc["items"][0]
    assert first["trace"]["skipped"] == {"malformed row": 3, "unknown GPU model": 1, "impossible request": 2}
    assert first["gpus"] == 6
    levels = [p["demand"] for p in first["points"]]
    assert levels[0] == 0
    assert levels[-1] == pytest.approx(1.3)
    assert all(0 <= p["allocation_ratio"] <= 1 for p in first["points"])
    assert {"fragmentation_ratio", "failed_pods"} <= set(first["points"][-1])
    assert "skipped" in proc.stderr
    assert "unknown GPU model" in proc.stderr
    assert plot.stat().st_size > 1000


def test_cli_simulate_table(tmp_path: Path) -> None:
    proc = _cli(
        "--trace",
        str(_write(tmp_path / "p.csv", PODS_CSV)),
        "--nodes",
        str(_write(tmp_path / "n.csv", NODES_CSV)),
    )
    assert proc.returncode == 0, proc.stderr
    assert "SHAREGPU" in proc.stdout
    assert "100%" in proc.stdout
    assert "failed pods" in proc.stdout


@pytest.mark.parametrize(
    ("args", "text"),
    [
        pytest.param(["--trace", "/nonexistent/pods.csv"], "no such file", id="missing-trace"),
        pytest.param(["--policy", "tetris"], "unknown policy 'tetris'", id="unknown-policy"),
    ],
)
def test_cli_simulate_errors_are_one_line(tmp_path: Path, args: list[str], text: str) -> None:
    nodes = _write(tmp_path / "nodes.csv", NODES_CSV)
    pods = _write(tmp_path / "pods.csv", PODS_CSV)
    base = {"--trace": str(pods), "--nodes": str(nodes)}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    proc = _cli(*[x for kv in base.items() for x in kv])
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("sharegpu: error: ")
    assert text in lines[0]


def test_pinned_shapes_skip_nodes_they_can_never_use_and_decide_the_same(
    small_cluster: list[Node], default_pods: list[Request], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a quarter of the pods pinned to GPU models, a shape's gradient is computed only on
    the nodes that could ever take it, over the workload groups their model may serve: every
    placement is the one a gradient over every node and every group gives."""
    from sharegpu.placement.fragmentation import FragmentationTracker
    from sharegpu.placement.workload import Workload
    from sharegpu.sim.trace import LoadReport, screen_pods
    from sharegpu.sim.variants import make_variant

    nodes = small_cluster[::2]  # every 8th node: the two replays below take a few seconds
    pods = screen_pods(
        enumerate(make_variant(default_pods, nodes, "pin25", seed=0)),
        nodes,
        LoadReport("pin25"),
    )
    pinned = sum(1 for p in pods if p.models)
    assert pinned > len(pods) // 5
    narrow = simulate(nodes, pods, "ours", 42)
    state = ClusterState(nodes, Workload.from_requests(pods))
    assert len(state.frag.views) > 1, "every model serves every group"
    eligible = [int(state.could_ever_host(p).sum()) for p in {p.shape: p for p in pods if p.models}.values()]
    assert max(eligible) < len(nodes), "no pinned shape leaves a node out"

    monkeypatch.setattr(
        ClusterState, "could_ever_host", lambda self, request: np.ones(len(self.nodes), dtype=np.bool_)
    )
    monkeypatch.setattr(FragmentationTracker, "_per_model", lambda self, model: [(slice(None), self.all)])
    wide = simulate(nodes, pods, "ours", 42)
    assert narrow.points == wide.points
    assert narrow.failed_pods == wide.failed_pods
