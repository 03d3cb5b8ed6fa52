"""Tenants that wait for their own work (issue 33; bench/isolation.py --sections syncing).

Every training step and every inference request launches some kernels and then waits for them.
Such a tenant leaves the card idle between its bursts (the sync's return, its host code, its next
launches), which a tenant that only queues work never does. Each case here runs its tenants
together twice in one invocation, with sharegpu and without, and each tenant counts its own
finished kernel time in the window (`sgprobe syncloop`, or the cuda-python client
bench/_pyclient.py; `sgprobe saturate` for a tenant that never waits).

What a case is judged by (docs/design/arbitration.md, "Tenants that synchronise"):

* **split**: each tenant within 1 point of what the policies give it out of what the card ran
  for all of them under sharegpu (S): classes in order (online, normal, offline), and within a
  class the arbiter's weights (a `cap`/`burst` tenant its guarantee, `share` tenants what the
  guarantees leave, in proportion), each tenant at most its ceiling and at most what it does
  alone on the card (its *demand*: a tenant that cannot use its share leaves the rest to others).
* **card**: S at most 1 point below the same tenants without sharegpu; for `cap` cases, which
  are not work-conserving, below the smaller of that and the sum of min(cap, demand).

All figures come from the simulated GPU.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _node import Node, parse, start_at
from sharegpu.arbiter import read_arbiter, tune_arbiter
from sharegpu.native import probe_path
from sharegpu.spec import ComputeSpec

PYCLIENT = Path(__file__).resolve().parent / "_pyclient.py"
CLASS_ORDER = ("online", "normal", "offline")
IDLE_GRACE_US = 500  # the arbiter's idle grace at the default quantum (docs/design/arbitration.md)
LEND_MIN_GAP_US = 100  # the shortest gap a holder lends (native/shim/arbiter.c, LEND_MIN_GAP_NS)
# The simulated GPU's switch between two programs that both have work (native/simgpu: ctxsw_us,
# default 10 µs; the bench's nodes leave it so): what the run without sharegpu pays per switch.
GPU_SWITCH_US = 10.0


@dataclass(frozen=True)
class Work:
    """What one tenant runs: bursts of `kernels` kernels of `us` µs, each followed by a sync and
    `gap_us` of host time; kernels=0 is a tenant that never waits (double-buffered batches)."""

    kernels: int
    us: int
    gap_us: int = 20
    client: str = "c"  # "c": sgprobe; "py": bench/_pyclient.py (cuda-python)

    @property
    def burst_us(self) -> int:
        return max(self.kernels, 1) * self.us

    def label(self) -> str:
        length = f"{self.us / 1000:g} ms"
        if not self.kernels:
            return f"saturating, {length} kernels"
        gap = f"{self.gap_us} µs" if self.gap_us < 1000 else f"{self.gap_us / 1000:g} ms"
        client = " (Python)" if self.client == "py" else ""
        return f"{self.kernels} x {length}, {gap}{client}"

    def command(self, seconds: float, start_ns: int) -> list[str]:
        if not self.kernels:
            return [str(probe_path()), "saturate", f"{seconds:g}", str(self.us), "kernel", str(start_ns)]
        args = [f"{seconds:g}", str(self.kernels), str(self.us), str(self.gap_us), str(start_ns)]
        if self.client == "py":
            return [sys.executable, str(PYCLIENT), *args]
        return [str(probe_path()), "syncloop", *args]


@dataclass(frozen=True)
class Tenant:
    pct: int
    work: Work
    policy: str = "share"
    priority: str = "normal"
    ceiling: int | None = None  # burst: the ceiling in percent

    def spec(self) -> ComputeSpec:
        if self.policy == "burst":
            return ComputeSpec.parse(
                f"{self.pct}%", "burst", ceiling=f"{self.ceiling}%", priority=self.priority
            )
        return ComputeSpec.parse(f"{self.pct}%", self.policy, priority=self.priority)

    def label(self) -> str:
        what = f"{self.pct}%" if self.ceiling is None else f"{self.pct}-{self.ceiling}%"
        return what if self.priority == "normal" else f"{what} {self.priority}"


@dataclass(frozen=True)
class Case:
    group: str
    tenants: tuple[Tenant, ...]

    @property
    def policy(self) -> str:
        policies = {t.policy for t in self.tenants}
        return policies.pop() if len(policies) == 1 else "mixed"

    def label(self) -> str:
        works = {t.work for t in self.tenants}
        if len(works) == 1:
            return next(iter(works)).label()
        return " + ".join(t.work.label() for t in self.tenants)

    def configured(self) -> str:
        return "/".join(t.label() for t in self.tenants)

    def seconds(self, base: float) -> float:
        """Long enough for 40 of the longest bursts, so that the window's edges weigh little."""
        return max(base, 40 * max(t.work.burst_us for t in self.tenants) / 1e6)


def _cases() -> list[Case]:
    def pair(work: Work, split: Sequence[int] = (30, 70), policy: str = "share") -> tuple[Tenant, ...]:
        return tuple(Tenant(p, work, policy) for p in split)

    cases: list[Case] = []
    for kernels in (1, 4, 16):
        for us in (100, 500, 2000, 5000):
            cases.append(Case("bursts x kernel length, share 30/70", pair(Work(kernels, us))))
    for gap in (200, 1000):
        cases.append(Case("host time between bursts, share 30/70", pair(Work(4, 500, gap))))
    for us in (200, 1000, 2000):
        cases.append(Case("Python driver-API client, share 30/70", pair(Work(4, us, client="py"))))
    cases.append(Case("Python driver-API client, cap 30/70", pair(Work(4, 200, client="py"), policy="cap")))
    cases.append(Case("Python driver-API client, cap 30/70", pair(Work(4, 1000, client="py"), policy="cap")))
    w = Work(4, 500)
    cases.append(Case("splits", pair(w, (10, 90))))
    cases.append(Case("splits", pair(w, (10, 20, 30, 40))))
    cases.append(Case("policies", pair(w, (30, 70), "cap")))
    cases.append(Case("policies", pair(Work(4, 200), (30, 70), "cap")))
    cases.append(Case("policies", (Tenant(20, w, "burst", ceiling=60), Tenant(80, w, "share"))))
    cases.append(Case("policies", (Tenant(50, w), Tenant(50, Work(0, 500), priority="offline"))))
    service = Work(4, 200, gap_us=5000)
    cases.append(Case("a service next to a saturating job", (Tenant(50, service), Tenant(50, Work(0, 500)))))
    cases.append(Case("a service next to a saturating job", (Tenant(30, service), Tenant(70, Work(0, 500)))))
    cases.append(
        Case(
            "a service next to a saturating job",
            (Tenant(50, service, priority="online"), Tenant(50, Work(0, 500), priority="offline")),
        )
    )
    # The service waits for each request before its host time: a request that waits behind an
    # offline kernel moves the next one, so its arrivals keep a beat only while it is held for.
    cases.append(
        Case(
            "a service next to a saturating job",
            (Tenant(50, service, priority="online"), Tenant(50, Work(0, 2000), priority="offline")),
        )
    )
    return cases


CASES = _cases()


def waterfill(capacity: float, weights: Sequence[float], caps: Sequence[float]) -> list[float]:
    """Share `capacity` in proportion to `weights`, none above its cap; what a capped one leaves
    goes to the others in the same proportion."""
    got = [0.0] * len(weights)
    open_ = [i for i, w in enumerate(weights) if w > 0 and caps[i] > 0]
    left = capacity
    while open_ and left > 1e-9:
        total = sum(weights[i] for i in open_)
        share = {i: left * weights[i] / total for i in open_}
        full = [i for i in open_ if got[i] + share[i] >= caps[i]]
        if not full:
            for i in open_:
                got[i] += share[i]
            break
        for i in full:
            left -= caps[i] - got[i]
            got[i] = caps[i]
        open_ = [i for i in open_ if i not in full]
    return got


def expected(tenants: Sequence[Tenant], demands: Sequence[float], capacity: float) -> list[float]:
    """What the policies give each tenant (percent of the card) out of `capacity`, given what
    each does alone (`demands`): classes in order; within a class `cap`/`burst` tenants weigh
    their guarantee and `share` tenants what the guarantees leave in proportion to their
    shares (the arbiter's effective weights), each capped by its ceiling and its demand."""
    got = [0.0] * len(tenants)
    left = capacity
    for cls in CLASS_ORDER:
        members = [i for i, t in enumerate(tenants) if t.priority == cls]
        if not members:
            continue
        guaranteed = sum(tenants[i].pct for i in members if tenants[i].policy in ("cap", "burst"))
        shares = sum(tenants[i].pct for i in members if tenants[i].policy == "share")
        rest = max(100 - guaranteed, 1)
        weights, caps = [], []
        for i in members:
            t = tenants[i]
            if t.policy == "share":
                weights.append(t.pct * rest / shares)
                caps.append(demands[i])
            else:
                ceiling = t.pct if t.policy == "cap" else (t.ceiling or 100)
                weights.append(float(t.pct))
                caps.append(min(ceiling, demands[i]))
        for i, g in zip(members, waterfill(left, weights, caps), strict=True):
            got[i] = g
        left -= sum(got[i] for i in members)
    return got


@dataclass
class Result:
    case: Case
    got: list[float]  # sharegpu: percent of the card, per tenant (median of the runs)
    bare: list[float]  # without sharegpu
    demands: list[float]
    handovers: float = 0.0  # per second of the window
    idle_us: float = 0.0  # GPU idle per handover (grant - release)
    want: list[float] = field(default_factory=list)
    card_goal: float = 0.0

    def __post_init__(self) -> None:
        self.want = expected(self.case.tenants, self.demands, sum(self.got))
        bare = sum(self.bare)
        if self.case.policy == "cap":
            capped = sum(min(t.pct, d) for t, d in zip(self.case.tenants, self.demands, strict=True))
            self.card_goal = min(bare, capped) - 1
        else:
            self.card_goal = bare - 1

    @property
    def turns_bound(self) -> float:
        """The busiest the card can be when each tenant holds it alone in turn, a turn being at
        least one burst, at the split the policies give, each hand-over costing what the GPU's
        own switch between two programs costs (GPU_SWITCH_US, which the run without sharegpu
        pays at every switch).

        A tenant's own gap (its sync's return, host code, next launch) idles the card only when
        its next turn follows its own; after another tenant's turn that gap was covered. So the
        best order puts another tenant between any two turns, and only a tenant with more than
        half of all the turns must follow itself, at least (its turns - the others' turns)
        times, each costing its gap g = b (1/e - 1) (b its burst's GPU time, e how busy it keeps
        the card alone), or two hand-overs where the arbiter lends a gap that long to another
        tenant (LEND_MIN_GAP_US); every other turn boundary is a hand-over. Per unit of work:
        1 / (1 + that idle)."""
        total = sum(self.want)
        if total <= 0:
            return 0.0
        turns, gaps = [], []
        for t, w, d in zip(self.case.tenants, self.want, self.demands, strict=True):
            e = self.holding_efficiency(t, d) / 100
            burst = t.work.burst_us
            turns.append(w / total / burst)
            gap = burst * (1 / e - 1) if 0 < e < 1 else 0.0
            peers = sum(o.priority == t.priority for o in self.case.tenants) - 1
            lends = gap >= LEND_MIN_GAP_US and peers and t.priority != "online"
            gaps.append(2 * GPU_SWITCH_US if lends else gap)
        all_turns = sum(turns)
        follows = [max(0.0, 2 * n - all_turns) for n in turns]
        idle = sum(f * g for f, g in zip(follows, gaps, strict=True))
        idle += (all_turns - sum(follows)) * GPU_SWITCH_US
        return 100 / (1 + idle)

    @staticmethod
    def holding_efficiency(tenant: Tenant, demand: float) -> float:
        """How busy a tenant keeps the card while it holds it: what it does alone, unless its
        host time is longer than the arbiter's idle grace (500 µs), which it does not hold."""
        return 100.0 if tenant.work.gap_us >= IDLE_GRACE_US else demand

    @property
    def in_goal(self) -> bool:
        """Issue 33's split goal holds a case whose tenants all want more than their share."""
        return all(d > t.pct + 1 for t, d in zip(self.case.tenants, self.demands, strict=True))

    @property
    def split_error(self) -> float:
        return max(abs(g - w) for g, w in zip(self.got, self.want, strict=True))

    @property
    def split_met(self) -> bool:
        return self.split_error <= 1.0

    @property
    def card_met(self) -> bool:
        return sum(self.got) >= self.card_goal

    @property
    def card_verdict(self) -> str:
        """The card's goal: "yes" met, "bound" short only where turns are (card_bound), "NO"."""
        return "yes" if self.card_met else ("bound" if self.card_bound else "NO")

    @property
    def card_bound(self) -> bool:
        """Short of the goal where turns cannot reach it, and within 1 point of what they can."""
        return (
            not self.card_met and self.turns_bound < self.card_goal and sum(self.got) >= self.turns_bound - 1
        )


Spawn = Callable[[list[str], dict[str, str]], subprocess.Popen[str]]


def run_together(node: Node, jobs: list[tuple[dict[str, str], Work]], seconds: float) -> list[float]:
    """Start every job at one common instant; each one's achieved share of the card, percent."""
    python = any(w.client == "py" for _, w in jobs)
    delay = (1.5 if python else 0.4) + 0.1 * len(jobs)
    start = start_at(delay)
    commands = [work.command(seconds, start) for _, work in jobs]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv, (env, _) in zip(commands, jobs, strict=True)
    ]
    got = []
    for argv, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=120 + 3 * seconds)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {err.strip()} {out.strip()}")
        got.append(float(parse(out)["achieved"]) * 100)
    return got


def measure(
    node: Node,
    cases: Sequence[Case],
    *,
    runs: int,
    seconds: float,
    handoff: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Result]:
    demand_of: dict[Work, float] = {}

    def demand(work: Work, window: float) -> float:
        if work not in demand_of:
            node.clear_tenants()
            demand_of[work] = run_together(node, [(node.base_env, work)], window)[0]
        return demand_of[work]

    results = []
    for case in cases:
        window = case.seconds(seconds)
        demands = [demand(t.work, window) for t in case.tenants]
        got: list[list[float]] = []
        bare: list[list[float]] = []
        handovers: list[float] = []
        idle: list[float] = []
        for _ in range(runs):
            node.clear_tenants()
            jobs = [(node.tenant_env(f"t{i}", t.spec()), t.work) for i, t in enumerate(case.tenants)]
            if handoff:
                tune_arbiter(node.arbiter(), handoff=handoff)
            before = read_arbiter(node.arbiter())
            got.append(run_together(node, jobs, window))
            after = read_arbiter(node.arbiter())
            n = after.handovers - before.handovers
            handovers.append(n / window)
            if n:
                idle.append((after.handover_idle_ns - before.handover_idle_ns) / n / 1000)
            node.clear_tenants()
            bare.append(run_together(node, [(node.base_env, t.work) for t in case.tenants], window))
        result = Result(
            case,
            [statistics.median(r[i] for r in got) for i in range(len(case.tenants))],
            [statistics.median(r[i] for r in bare) for i in range(len(case.tenants))],
            demands,
            statistics.median(handovers),
            statistics.median(idle) if idle else 0.0,
        )
        progress(line(result))
        results.append(result)
    return results


def _pcts(values: Sequence[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def line(r: Result) -> str:
    split = ("yes" if r.split_met else "NO") + ("" if r.in_goal else "*")
    return (
        f"{r.case.policy:6} {r.case.label():34} {r.case.configured():20} {_pcts(r.got):20} "
        f"{_pcts(r.want):20} {_pcts(r.bare):20} {sum(r.got):6.1f} {r.card_goal + 1:6.1f} "
        f"{r.turns_bound:6.1f} {r.handovers:5.0f} {r.idle_us:5.0f}  {split:5} {r.card_verdict}"
    )


HEADER = (
    f"{'policy':6} {'workload (burst, host time)':34} {'configured':20} {'got (sharegpu)':20} "
    f"{'policies give':20} {'bare':20} {'card':>6} {'goal':>6} {'turns':>6} {'ho/s':>5} {'idle':>5}  "
    "split card"
)


def table(
    results: Sequence[Result], runs: int, cpu_wakeup_us: int | None = None, handoff: str | None = None
) -> list[str]:
    cpus = (
        "" if cpu_wakeup_us is None else f", CPUs asked to wake within {cpu_wakeup_us} µs (PM QoS, both runs)"
    )
    if handoff:
        cpus += f", hand-overs {handoff}"
    lines = [
        f"Tenants that synchronise — simulated GPU, median of {runs} run(s) per figure{cpus}",
        "got: each tenant's finished kernel time / window, % of the card; policies give: what the",
        "policies give each out of the card's total under sharegpu (split goal: within 1 point);",
        "bare: the same tenants without sharegpu; card: the total under sharegpu; goal: the total",
        "without sharegpu (for caps, at most the caps), to reach within 1 point; turns: the most",
        "an arbiter that gives the card to one tenant at a time, a burst or more each, can reach at",
        "that split, a tenant that follows itself leaving the card idle through its own gap (or",
        f"lending a gap of {LEND_MIN_GAP_US} µs or more to a tenant of its class, for two hand-overs) and a",
        f"hand-over costing the GPU's own switch between two programs ({GPU_SWITCH_US:g} µs, which the run",
        "without sharegpu pays at each); card 'bound': within 1 point of it, short of the goal only",
        "where turns are; ho/s: token hand-overs per second; idle: µs from a release",
        "to the next holder's wake-up; *: a tenant wants less than its share (outside issue 33's",
        "split goal, judged here against what it does alone).",
    ]
    group = None
    for r in results:
        if r.case.group != group:
            group = r.case.group
            lines += ["", f"-- {group}", HEADER]
        lines.append(line(r))
    split_ok = sum(r.split_met for r in results)
    card_ok = sum(r.card_met for r in results)
    goal = [r for r in results if r.in_goal]
    bound = sum(r.card_bound for r in results)
    lines += [
        "",
        f"split within 1 point: {split_ok}/{len(results)} ({sum(r.split_met for r in goal)}/{len(goal)} "
        "of those where every tenant wants more than its share); card within 1 point of its goal: "
        f"{card_ok}/{len(results)} (of the others, {bound} where turns cannot reach it, within 1 point of "
        "what they can)",
    ]
    return lines


CARD_MARKS = {"yes": " ", "bound": "~", "NO": "-"}  # the modes table's short form of card_verdict


def compare_table(by_mode: Mapping[str | None, Sequence[Result]]) -> list[str]:
    """The cards of the same cases under each hand-over mode, side by side (one invocation, the
    modes measured in turn), with each mode's split error and the run without sharegpu."""
    modes = list(by_mode)
    names = [m or "default" for m in modes]
    head = f"{'case':62} " + " ".join(f"{n + ' card':>13} {'split':>5}" for n in names)
    lines = [
        "Hand-over modes side by side: card busy % and the worst split error (points) under each;",
        "(*: a tenant wants less than its share, outside the split goal); bare: without sharegpu",
        "(the first mode's run); turns: as above",
        f"{head} {'bare':>6} {'turns':>6}",
    ]
    firsts = by_mode[modes[0]]
    for i, first in enumerate(firsts):
        label = f"{first.case.policy} {first.case.label()} {first.case.configured()}"
        cells = []
        for m in modes:
            r = by_mode[m][i]
            mark = CARD_MARKS[r.card_verdict]
            cells.append(f"{sum(r.got):12.1f}{mark} {r.split_error:5.1f}{'' if r.in_goal else '*'}")
        lines.append(
            f"{label[:62]:62} " + " ".join(cells) + f" {sum(first.bare):6.1f} {first.turns_bound:6.1f}"
        )
    met = ", ".join(
        f"{n} {sum(r.card_met for r in by_mode[m])}/{len(by_mode[m])}"
        for m, n in zip(modes, names, strict=True)
    )
    lines += [f"cards within 1 point of their goal (-: not, ~: within 1 point of turns): {met}"]
    return lines
