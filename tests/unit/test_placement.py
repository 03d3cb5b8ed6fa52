"""sharegpu.placement on small hand-made clusters where the right answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from sharegpu.errors import SpecError
from sharegpu.placement import (
    POLICIES,
    ClusterState,
    Node,
    NoFit,
    NoFitReason,
    Placement,
    PreemptionPlan,
    Priority,
    Request,
    Topology,
    Workload,
    make_policy,
    place,
    plan_preemption,
)

WHOLE = Workload(shapes=(Request(count=1, compute_milli=1000),), weights=(1.0,))


def node(
    name: str, gpus: int = 1, cpu: int = 64000, model: str = "V100M32", topology: Topology | None = None
) -> Node:
    return Node(
        name=name, cpu_milli=cpu, memory_mib=256 * 1024, gpus=gpus, model=model, gpu_memory_mib=32768,
        topology=topology,
    )  # fmt: skip


def cluster(*nodes: Node, workload: Workload = WHOLE) -> ClusterState:
    return ClusterState(list(nodes), workload)


def put(state: ClusterState, name: str, gpus: tuple[int, ...], request: Request) -> str:
    n = state.index[name]
    return state.allocate(Placement(name, n, gpus), request).id


def chosen(state: ClusterState, request: Request, policy: str, seed: int = 0) -> Placement:
    decision = place(state, request, policy, seed)
    assert isinstance(decision, Placement), decision
    return decision


def test_every_policy_places_a_fitting_request_on_a_fitting_gpu() -> None:
    for name in POLICIES:
        state = cluster(node("a", 2), node("b", 2))
        put(state, "a", (0,), Request(compute_milli=900))
        got = chosen(state, Request(compute_milli=500), name)
        assert (got.node, got.gpus) != ("a", (0,)), name


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param("best-fit", ("full", (0,)), id="best-fit-fullest-node"),
        pytest.param("gpu-packing", ("full", (0,)), id="packing-used-gpu-first"),
        pytest.param("fgd", ("full", (0,)), id="fgd-fills-the-fragment"),
        pytest.param("sharegpu", ("full", (0,)), id="ours-fills-the-fragment"),
        pytest.param("dot-product", ("idle", (0,)), id="dot-product-aligned-free-resources"),
    ],
)
def test_policy_choice_on_a_partly_used_cluster(policy: str, expected: tuple[str, tuple[int, ...]]) -> None:
    # "full" has a GPU half used: 500 milli that whole-GPU tasks cannot use (a fragment).
    state = cluster(node("idle", 1), node("full", 1))
    put(state, "full", (0,), Request(compute_milli=500))
    got = chosen(state, Request(compute_milli=500), policy)
    assert (got.node, got.gpus) == expected


def test_fgd_gradient_is_the_change_of_fragmentation() -> None:
    state = cluster(node("idle", 1), node("half", 1))
    put(state, "half", (0,), Request(compute_milli=500))
    assert state.frag.f.tolist() == [0.0, 500.0]  # half's free 500 is a fragment for a whole GPU
    delta = state.frag.delta_one(np.array([0, 1]), 500, 0, 0, 0)[:, 0]
    assert delta.tolist() == [500.0, -500.0]


def test_gpu_clustering_puts_same_sizes_together() -> None:
    state = cluster(node("a", 2), node("b", 2))
    put(state, "a", (0,), Request(compute_milli=300))
    put(state, "b", (1,), Request(compute_milli=250))
    got = chosen(state, Request(compute_milli=250), "gpu-clustering")
    assert (got.node, got.gpus) == ("b", (1,))


def test_ours_keeps_cpu_for_the_gpus_of_a_dense_node() -> None:
    # FGD sees no fragmentation either way (the workload's 2-core tasks still fit the dense node
    # after); ours sees that 12 of its 16 cores would strand most of its 8 GPUs.
    workload = Workload(shapes=(Request(count=1, compute_milli=1000, cpu_milli=2000),), weights=(1.0,))
    state = cluster(node("dense", 8, cpu=16000), node("roomy", 2, cpu=64000), workload=workload)
    assert state.frag.delta_one(np.array([0, 1]), 1000, 0, 12000, 0)[:, 0].tolist() == [0.0, 0.0]
    pod = Request(count=1, compute_milli=1000, cpu_milli=12000)
    assert chosen(state, pod, "ours").node == "roomy"


NVLINK_8 = Topology.parse(8, "nvlink:0,1,2,3|4,5,6,7 pcie:0,1|2,3|4,5|6,7")


@pytest.mark.parametrize(
    "policy", [pytest.param(p, id=p) for p in ("best-fit", "fgd", "sharegpu", "gpu-packing")]
)
def test_multi_gpu_request_gets_a_whole_nvlink_group(policy: str) -> None:
    state = cluster(node("n", 8, topology=NVLINK_8))
    put(state, "n", (1,), Request(compute_milli=200))
    got = chosen(state, Request(count=4, compute_milli=1000), policy)
    assert got.gpus == (4, 5, 6, 7)


def test_two_gpu_request_stays_in_one_group_and_takes_the_broken_one() -> None:
    state = cluster(node("n", 8, topology=NVLINK_8))
    put(state, "n", (1,), Request(compute_milli=200))
    got = chosen(state, Request(count=2, compute_milli=1000), "best-fit")
    assert set(got.gpus) <= {0, 2, 3}
    assert NVLINK_8.cost(got.gpus) == 1


def test_fractional_request_does_not_break_a_whole_group() -> None:
    state = cluster(node("n", 8, topology=NVLINK_8))
    put(state, "n", (4,), Request(compute_milli=1000))
    # best-fit is indifferent between the idle GPUs; the tie goes to the broken group (4-7),
    # and there to the GPU whose PCIe switch is already broken.
    assert chosen(state, Request(compute_milli=500), "best-fit").gpus == (5,)


def test_online_requests_spread_away_from_online_tenants() -> None:
    state = cluster(node("a", 2), node("b", 2))
    put(state, "a", (0,), Request(compute_milli=300, priority=Priority.online))
    online = Request(compute_milli=300, priority=Priority.online)
    for policy in ("best-fit", "gpu-packing", "fgd", "sharegpu"):
        got = chosen(state, online, policy)
        assert got.node == "b", policy
    # A normal request packs next to it as best-fit says.
    assert chosen(state, Request(compute_milli=300), "best-fit").gpus == (0,)


def test_offline_requests_pack_into_gaps() -> None:
    state = cluster(node("a", 2), node("b", 2))
    put(state, "b", (1,), Request(compute_milli=500))
    offline = Request(compute_milli=300, priority=Priority.offline)
    for seed in range(5):  # even the random policy: the gap comes first
        got = chosen(state, offline, "random", seed)
        assert (got.node, got.gpus) == ("b", (1,))


@pytest.mark.parametrize(
    ("request_", "reason", "text"),
    [
        pytest.param(
            Request(models=frozenset({"H100"})), NoFitReason.no_such_model, "model H100", id="model"
        ),
        pytest.param(Request(count=4), NoFitReason.too_large, "even when empty", id="too-many-gpus"),
        pytest.param(Request(cpu_milli=128000), NoFitReason.too_large, "even when empty", id="too-much-cpu"),
        pytest.param(Request(cpu_milli=40000), NoFitReason.host_resources, "free CPU", id="cpu-taken"),
        pytest.param(
            Request(compute_milli=600), NoFitReason.gpu_resources, "enough free GPU", id="gpu-taken"
        ),
    ],
)
def test_no_fit_says_why(request_: Request, reason: NoFitReason, text: str) -> None:
    state = cluster(node("a", 2))
    put(state, "a", (0, 1), Request(count=2, compute_milli=500, cpu_milli=30000))
    decision = place(state, request_, "sharegpu")
    assert isinstance(decision, NoFit)
    assert decision.reason is reason
    assert text in str(decision)


def test_random_is_deterministic_by_seed() -> None:
    state = cluster(*(node(f"n{i}", 4) for i in range(20)))
    first = [chosen(state, Request(compute_milli=100), "random", seed).node for seed in range(10)]
    again = [chosen(state, Request(compute_milli=100), "random", seed).node for seed in range(10)]
    assert first == again
    assert len(set(first)) > 1


def test_allocate_refuses_what_does_not_fit_and_release_restores() -> None:
    state = cluster(node("a", 1))
    alloc = put(state, "a", (0,), Request(compute_milli=700))
    with pytest.raises(SpecError, match="lacks room"):
        put(state, "a", (0,), Request(compute_milli=400))
    before = state.frag.f.copy()
    state.release(alloc)
    assert state.free_c[0, 0] == 1000
    assert state.allocation_ratio == 0
    assert state.frag.f[0] <= before[0]


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        pytest.param({"count": -1}, "must not be negative", id="negative-count"),
        pytest.param({"compute_milli": 0}, "1..1000", id="zero-compute"),
        pytest.param({"compute_milli": 1500}, "1..1000", id="over-a-gpu"),
        pytest.param({"cpu_milli": -5}, "must not be negative", id="negative-cpu"),
    ],
)
def test_bad_requests_are_spec_errors(kwargs: dict[str, int], text: str) -> None:
    with pytest.raises(SpecError, match=text):
        Request(**kwargs)  # type: ignore[arg-type]


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(SpecError, match="fgd"):
        make_policy("tetris")


# -- preemption --------------------------------------------------------------------------------

OFFLINE = Priority.offline


def test_preemption_evicts_the_fewest_victims() -> None:
    state = cluster(node("a", 1), node("b", 1))
    for milli in (300, 300, 400):
        put(state, "a", (0,), Request(compute_milli=milli, priority=OFFLINE))
    big = put(state, "b", (0,), Request(compute_milli=1000, priority=OFFLINE))
    plan = plan_preemption(state, Request(compute_milli=600, priority=Priority.online))
    assert isinstance(plan, PreemptionPlan)
    assert plan.victims == (big,)
    assert plan.placement.node == "b"


def test_preemption_prefers_the_least_fragmentation_left() -> None:
    # Either node frees room with one victim; evicting the 1000 on "b" leaves a 500 fragment,
    # evicting the 500 on "a" leaves the GPU exactly full.
    state = cluster(node("a", 1), node("b", 1))
    put(state, "a", (0,), Request(compute_milli=500, priority=OFFLINE))
    small = put(state, "a", (0,), Request(compute_milli=500, priority=OFFLINE))
    put(state, "b", (0,), Request(compute_milli=1000, priority=OFFLINE))
    plan = plan_preemption(state, Request(compute_milli=500, priority=Priority.online))
    assert isinstance(plan, PreemptionPlan)
    assert plan.placement.node == "a"
    assert len(plan.victims) == 1
    assert plan.victims[0] in {small, next(iter(state.node_allocations[0]))}
    assert plan.fragmentation == 0


def test_preemption_never_evicts_normal_or_online_tenants() -> None:
    state = cluster(node("a", 1))
    put(state, "a", (0,), Request(compute_milli=800, priority=Priority.normal))
    put(state, "a", (0,), Request(compute_milli=200, priority=OFFLINE))
    plan = plan_preemption(state, Request(compute_milli=500, priority=Priority.online))
    assert isinstance(plan, NoFit)
    assert "would still not make room" in str(plan)


def test_preemption_is_useless_for_a_request_no_node_can_hold() -> None:
    state = cluster(node("a", 1))
    put(state, "a", (0,), Request(compute_milli=1000, priority=OFFLINE))
    assert isinstance(plan_preemption(state, Request(count=2, priority=Priority.online)), NoFit)


def test_preemption_without_need_has_no_victims_and_only_online_preempts() -> None:
    state = cluster(node("a", 1))
    plan = plan_preemption(state, Request(compute_milli=500, priority=Priority.online))
    assert isinstance(plan, PreemptionPlan)
    assert plan.victims == ()
    with pytest.raises(SpecError, match="only online"):
        plan_preemption(state, Request(compute_milli=500))


def test_topology_validation() -> None:
    with pytest.raises(SpecError, match="two nvlink groups"):
        Topology.parse(4, "nvlink:0,1|1,2")
    with pytest.raises(SpecError, match="names GPU 9"):
        Topology.parse(4, "pcie:0,9")
    assert Topology.default(8, "T4").nvlink == ()
    assert Topology.default(8, "A100").nvlink == ((0, 1, 2, 3), (4, 5, 6, 7))


# -- model-aware stranding, model reserve, memory, QoS classes ------------------------------------


def test_a_node_whose_model_no_shape_may_use_strands_all_its_free_gpus() -> None:
    from sharegpu.placement.policies import SharegpuPolicy

    pinned = Workload(
        shapes=(Request(count=1, compute_milli=1000, models=frozenset({"V100M32"})),), weights=(1.0,)
    )
    state = cluster(node("v100", 2), node("t4", 2, model="T4"), workload=pinned)
    put(state, "t4", (0,), Request(compute_milli=300))
    stranded = SharegpuPolicy().stranding(state).stranded()
    assert stranded.tolist() == [0.0, 1700.0]


def test_stranding_uses_the_cpu_of_the_shapes_that_can_use_each_node() -> None:
    from sharegpu.placement.policies import SharegpuPolicy

    # CPU-hungry shapes may use only T4, light ones only V100: each node gets its own ratio.
    workload = Workload(
        shapes=(
            Request(count=1, compute_milli=1000, cpu_milli=16000, models=frozenset({"T4"})),
            Request(count=1, compute_milli=1000, cpu_milli=2000, models=frozenset({"V100M32"})),
        ),
        weights=(0.5, 0.5),
    )
    state = cluster(node("v100", 4, cpu=16000), node("t4", 4, cpu=16000, model="T4"), workload=workload)
    model = SharegpuPolicy().stranding(state)
    assert model.rho.tolist() == [2.0, 16.0]  # milli-cores per milli-GPU
    # 16 cores feed 1 T4 GPU of the 4 (3000 stranded, weight 0.5) and all 4 V100 GPUs.
    assert model.stranded().tolist() == [0.5 * 4000, 0.5 * 4000 + 0.5 * 3000]


def test_scarcity_is_the_demand_of_the_shapes_a_node_holds_over_their_supply() -> None:
    from sharegpu.placement.policies import SharegpuPolicy

    # The 8-GPU, 120-core shape (2/3 of the GPU demand) fits only g3, a third of the capacity;
    # the 1-GPU shape (1/3) fits every node.
    workload = Workload(
        shapes=(
            Request(count=8, compute_milli=1000, cpu_milli=120000),
            Request(count=1, compute_milli=1000, cpu_milli=8000),
        ),
        weights=(0.2, 0.8),
    )
    state = cluster(
        node("g3", 8, cpu=128000), node("g2a", 8, cpu=96000), node("g2b", 8, cpu=96000), workload=workload
    )
    scarcity = SharegpuPolicy().stranding(state).scarcity
    assert scarcity == pytest.approx([2 / 3 * 3 + 1 / 3, 1 / 3, 1 / 3])
    # A node no shape can use (4 cores) is not scarce.
    with_tiny = cluster(node("g3", 8, cpu=128000), node("tiny", 1, cpu=4000), workload=workload)
    # g3 is the only node either shape can use: each adds its share x 9/8 (capacity over supply).
    assert SharegpuPolicy().stranding(with_tiny).scarcity == pytest.approx([9 / 8, 0.0])


def _cpu_bound_case() -> tuple[ClusterState, Request]:
    # 12-core and 2-core one-GPU shapes (7 cores per GPU) on nodes with 4 cores per GPU: CPU runs
    # out first. Node a (2 GPUs, 8 cores) feeds both its GPUs; b (4 GPUs, 16 cores) only ~2.3.
    workload = Workload(
        shapes=(
            Request(count=1, compute_milli=1000, cpu_milli=12000),
            Request(count=1, compute_milli=1000, cpu_milli=2000),
        ),
        weights=(0.5, 0.5),
    )
    state = cluster(node("a", 2, cpu=8000), node("b", 4, cpu=16000), workload=workload)
    return state, Request(count=1, compute_milli=1000, cpu_milli=4000)


def test_cpu_pressure_is_the_workloads_cpu_per_gpu_over_the_gpu_nodes() -> None:
    from sharegpu.placement.policies import SharegpuPolicy

    state, _ = _cpu_bound_case()
    assert SharegpuPolicy().stranding(state).cpu_pressure == pytest.approx(7.0 / 4.0)
    roomy = cluster(node("a", 2), node("cpu", 0, cpu=512000), workload=state.workload)
    # 64 cores for 2 GPUs; nodes without GPUs do not count.
    assert SharegpuPolicy().stranding(roomy).cpu_pressure == pytest.approx(7.0 / 32.0)


def test_under_cpu_pressure_the_stranded_gpu_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    from sharegpu.placement import policies

    # The 4-core pod on b takes a GPU b's CPU could not have fed; on a it would take half of a
    # node whose GPUs are all feedable. FGD, and our stranding at weight 1, pick a.
    state, pod = _cpu_bound_case()
    assert chosen(state, pod, "ours").node == "b"
    assert chosen(_cpu_bound_case()[0], pod, "fgd").node == "a"
    monkeypatch.setattr(policies, "CPU_BOUND_STRANDING_WEIGHT", 1.0)
    assert chosen(_cpu_bound_case()[0], pod, "ours").node == "a"


def _with_cpu_only_pods(cpu_node_milli: int, gpu_node_cpu: tuple[int, int] = (12000, 16000)) -> ClusterState:
    # Half the pods ask 1 GPU and 6 cores, half no GPU and 8 cores. GPU nodes: a (2 GPUs) and b
    # (4 GPUs), 4.7 cores per GPU by default: CPU-bound (pressure 6 / 4.7).
    workload = Workload(
        shapes=(Request(count=1, compute_milli=1000, cpu_milli=6000), Request(count=0, cpu_milli=8000)),
        weights=(0.5, 0.5),
    )
    a_cpu, b_cpu = gpu_node_cpu
    return cluster(
        node("a", 2, cpu=a_cpu),
        node("b", 4, cpu=b_cpu),
        node("cpu", 0, cpu=cpu_node_milli),
        workload=workload,
    )


def test_cpu_that_pods_without_gpus_take_from_gpu_nodes_counts_against_their_gpus() -> None:
    from sharegpu.placement.policies import SharegpuPolicy

    pod = Request(count=1, compute_milli=1000, cpu_milli=4000)
    # A 512-core node without GPUs holds every CPU-only pod: a GPU needs its shape's 6 cores. a
    # feeds both its GPUs, b only 2.7 of 4, so taking one of b's GPUs strands less.
    roomy = SharegpuPolicy().stranding(_with_cpu_only_pods(512000))
    assert roomy.spilled_cpu == 0.0
    assert roomy.rho.tolist() == [6.0, 6.0, 0.0]
    assert chosen(_with_cpu_only_pods(512000), pod, "ours").node == "b"
    # A 1-core node without GPUs: per milli-GPU of demand, 8 milli-cores of CPU-only pods
    # (4000 per pod over 500 milli-GPU per pod), less the 1/6 the node holds, come to the GPU
    # nodes. Neither feeds all its GPUs now; the stranded GPU changes alike, FGD's gradient picks a.
    short = SharegpuPolicy().stranding(_with_cpu_only_pods(1000))
    assert short.spilled_cpu == pytest.approx(8.0 - 1.0 / 6.0)
    assert short.rho[:2] == pytest.approx([6.0 + 8.0 - 1.0 / 6.0] * 2)
    assert chosen(_with_cpu_only_pods(1000), pod, "ours").node == "a"
    # Where GPU, not CPU, is the bound (32 cores per GPU), rho stays the GPU shapes' own.
    gpu_bound = SharegpuPolicy().stranding(_with_cpu_only_pods(1000, (64000, 128000)))
    assert gpu_bound.cpu_pressure < 1.0
    assert gpu_bound.spilled_cpu > 0.0
    assert gpu_bound.rho.tolist() == [6.0, 6.0, 0.0]


def test_ours_sends_flexible_pods_to_the_model_most_shapes_may_use() -> None:
    # 40% of the workload may only use V100, 10% only T4. FGD counts the T4's GPUs as fragments
    # for the V100-only shapes, so filling them lowers F and a flexible pod goes there; ours
    # keeps the T4 for its pinned pods and fills the V100, the larger pool (as G2 is in the trace;
    # with equal pools the V100-only demand would make the V100 the scarce one).
    workload = Workload(
        shapes=(
            Request(count=1, compute_milli=1000, models=frozenset({"T4"})),
            Request(count=1, compute_milli=1000, models=frozenset({"V100M32"})),
            Request(count=1, compute_milli=1000),
        ),
        weights=(0.1, 0.4, 0.5),
    )
    state = cluster(node("t4", 2, model="T4"), node("v100", 8), workload=workload)
    flexible = Request(count=1, compute_milli=1000)
    assert chosen(state, flexible, "ours").node == "v100"
    assert chosen(state, flexible, "fgd").node == "t4"


def test_gpu_memory_refuses_a_fit_that_compute_alone_would_allow() -> None:
    state = cluster(node("a", 1), node("b", 1))
    put(state, "a", (0,), Request(compute_milli=300, memory_mib=30 * 1024))
    pod = Request(compute_milli=300, memory_mib=4 * 1024)
    for policy in POLICIES:
        assert chosen(state, pod, policy).node == "b", policy
    put(state, "b", (0,), Request(compute_milli=300, memory_mib=30 * 1024))
    refused = place(state, pod, "ours")
    assert isinstance(refused, NoFit)
    assert refused.reason is NoFitReason.gpu_resources


def test_ours_best_fit_counts_memory_left() -> None:
    # Same compute left on both GPUs of "a"; GPU 1 has less memory left: the tighter fit.
    state = cluster(node("a", 2))
    put(state, "a", (0,), Request(compute_milli=500, memory_mib=1024))
    put(state, "a", (1,), Request(compute_milli=500, memory_mib=16 * 1024))
    assert chosen(state, Request(compute_milli=500, memory_mib=4096), "ours").gpus == (1,)


def test_offline_packs_and_online_spreads_under_ours() -> None:
    state = cluster(node("a", 2), node("b", 2))
    put(state, "a", (0,), Request(compute_milli=300, priority=Priority.online))
    assert chosen(state, Request(compute_milli=300, priority=Priority.online), "ours").node == "b"
    assert chosen(state, Request(compute_milli=300, priority=Priority.offline), "ours").gpus == (0,)


def test_preemption_evicts_best_effort_before_burstable() -> None:
    # The trace's BE pods are offline, Burstable normal. Either victim makes room on its node.
    state = cluster(node("a", 1), node("b", 1))
    put(state, "a", (0,), Request(compute_milli=1000, priority=Priority.normal))
    offline = put(state, "b", (0,), Request(compute_milli=1000, priority=OFFLINE))
    plan = plan_preemption(state, Request(priority=Priority.online), evictable=(OFFLINE, Priority.normal))
    assert isinstance(plan, PreemptionPlan)
    assert plan.victims == (offline,)


def test_preemption_takes_burstable_only_when_best_effort_cannot_make_room() -> None:
    state = cluster(node("a", 1))
    burstable = put(state, "a", (0,), Request(compute_milli=800, priority=Priority.normal))
    put(state, "a", (0,), Request(compute_milli=200, priority=OFFLINE))
    online = Request(compute_milli=500, priority=Priority.online)
    assert isinstance(plan_preemption(state, online), NoFit)  # offline only, by default
    plan = plan_preemption(state, online, evictable=(OFFLINE, Priority.normal))
    assert isinstance(plan, PreemptionPlan)
    assert plan.victims == (burstable,)
    with pytest.raises(SpecError, match="never preempted"):
        plan_preemption(state, online, evictable=(Priority.online,))
