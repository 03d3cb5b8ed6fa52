"""sharegpu.sim and `sharegpu simulate` on the real Alibaba trace and on small bad inputs.

The trace ships in the repository at data/alibaba-gpu-v2023 (see its README for source and
citation). Without it these tests fail, they do not skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sharegpu.errors import ConfigError
from sharegpu.placement import Node, Request, policies
from sharegpu.placement.cluster import ClusterState
from sharegpu.sim import load_nodes, load_pods, sample

POD_LISTS = [
    "default",
    *(f"gpushare{n}" for n in (20, 40, 60, 80, 100)),
    *(f"multigpu{n}" for n in (20, 30, 40, 50)),
]


def test_node_lists_parse(data: Path, cluster: list[Node]) -> None:
    assert len(cluster) == 1523
    assert sum(n.gpus for n in cluster) == 6212
    gpu_nodes, _ = load_nodes(data / "openb_node_list_gpu_node.csv")
    assert len(gpu_nodes) == 1213
    assert {n.model for n in gpu_nodes} == {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"}


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in POD_LISTS])
def test_every_pod_list_parses(data: Path, cluster: list[Node], name: str) -> None:
    pods, report = load_pods(data / f"openb_pod_list_{name}.csv", cluster)
    assert report.skipped_total == 0, report.examples
    assert len(pods) == report.rows > 8000
    assert all(0 < p.compute_milli <= 1000 for p in pods)


def test_default_trace_figures(default_pods: list[Request]) -> None:
    assert len(default_pods) == 8152
    assert sum(1 for p in default_pods if p.count == 0) == 1088
    assert sum(1 for p in default_pods if p.count == 1 and p.compute_milli < 1000) > 2000


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


def test_bad_rows_are_counted_and_skipped(tmp_path: Path) -> None:
    nodes, node_report = load_nodes(_write(tmp_path / "nodes.csv", NODES_CSV))
    pods, report = load_pods(_write(tmp_path / "pods.csv", PODS_CSV), nodes)
    assert [p.name for p in pods] == ["ok-whole", "ok-half", "ok-cpu"]
    assert report.rows == 9
    assert dict(report.skipped) == {"malformed row": 3, "unknown GPU model": 1, "impossible request": 2}
    assert any("pods.csv:5: malformed row: memory_mib='lots'" in e for e in report.examples)
    assert node_report.loaded == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "sn,cpu_milli,gpu\nn0,1,1\n", "missing column(s) memory_mib, model", id="missing-column"
        ),
        pytest.param(
            "sn,cpu_milli,memory_mib,gpu,model\nn0,x,1,1,T4\n", "no usable node", id="no-usable-row"
        ),
    ],
)
def test_unusable_node_lists(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_nodes(_write(tmp_path / "nodes.csv", text))


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_nodes(tmp_path / "nope.csv")


def test_sample_reaches_the_target_demand(small_cluster: list[Node], default_pods: list[Request]) -> None:
    capacity = sum(n.gpus for n in small_cluster) * 1000
    pods = sample(default_pods, capacity, 1.3, seed=7)
    demand = sum(p.gpu_milli for p in pods)
    assert 1.3 * capacity <= demand < 1.3 * capacity + 8000


def test_cached_keys_match_a_fresh_look_after_every_change(
    small_cluster: list[Node], default_pods: list[Request]
) -> None:
    """The gradient (with ours' stranding and reserve) and the group pressure are cached per node
    and recomputed only where a node changed: after hundreds of placements and releases they
    equal what a fresh policy and an emptied cache compute."""
    from sharegpu.placement.candidates import Candidates, candidates
    from sharegpu.placement.engine import decide
    from sharegpu.placement.model import Placement
    from sharegpu.placement.workload import Workload

    state = ClusterState(small_cluster, Workload.from_requests(default_pods))
    ours = policies.make_policy("ours")
    assert isinstance(ours, policies.SharegpuPolicy)
    placed: list[str] = []
    for k, pod in enumerate(default_pods[:400]):
        decision = decide(state, pod, ours, None)
        if isinstance(decision, Placement):
            placed.append(state.allocate(decision, pod).id)
        if k % 3 == 2 and placed:
            state.release(placed.pop(len(placed) // 2))
    checked = 0
    for pod in {p.shape: p for p in default_pods if p.count}.values():
        cand: Candidates = candidates(state, pod)
        if len(cand):
            fresh = policies.make_policy("ours")
            assert isinstance(fresh, policies.SharegpuPolicy)
            np.testing.assert_allclose(ours.gradient(state, cand), fresh.gradient(state, cand), rtol=1e-12)
            checked += 1
    assert checked >= 5
    every = np.arange(len(state.nodes))
    cached = state.group_pressure(every).copy()
    state._pressure_seen[:] = -1
    assert np.array_equal(cached, state.group_pressure(every))
    assert cached.any()
