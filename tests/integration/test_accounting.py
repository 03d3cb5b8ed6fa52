"""GPU time as every surface reports it, against NVML's per-process figure and against what the
workloads themselves finished.

A bursty online tenant (4 x 1 ms every 30 ms, about 13% of the card) holds the token far longer
than the GPU runs for it; a saturating batch tenant takes the rest. The surfaces (`sharegpu
tenants`, `top`, `devices`, the API, the metrics) report the arbiter's charges; NVML's samples
(whole percents, one per sampling period) are their cross-check, and must agree within the
cross-check's 10 points,
the tenants of the card never more than the whole card. How exact the charges are is judged
against the workloads' own count of finished kernel time, within 1 point
(test_what_operators_see_is_what_the_workloads_got).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arbiterutil import achieved, compute_tenant, finish, spawn_in_pid_namespace, start_at
from conftest import Sim, parse_kv, table_cell
from metricsutil import api, families, free_port, running_agent, scrape_text, value

TRUTH = """
import json, sys
from sharegpu.devices import busy_by_pid
print(json.dumps({u: {str(p): r for p, r in m.items()} for u, m in busy_by_pid().items()}))
"""


def nvml_truth(sim: Sim, pids: dict[str, int]) -> dict[str, float]:
    """Each tenant's share of GPU 0 over NVML's last window, asked from outside any tenant."""
    done = subprocess.run(
        [sys.executable, "-c", TRUTH], env=sim.env(), capture_output=True, text=True, check=True, timeout=60
    )
    shares = json.loads(done.stdout)[sim.uuids()[0]]
    return {name: float(shares.get(str(pid), 0.0)) for name, pid in pids.items()}


def by_tenant(items: list[dict[str, Any]], key: str) -> dict[str, float]:
    return {t["id"]: float(t["devices"][0][key] or 0.0) for t in items}


def top_compute(text: str) -> dict[str, float]:
    """The achieved compute of each tenant row of `sharegpu top --once` ("13.2% / 100%")."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0] in ("web", "batch"):
            found[words[0]] = float(re.findall(r"(\d+(?:\.\d+)?)% / \d+%", line)[0]) / 100
    return found


def at_meter_tick(port: int, uuid: str) -> tuple[dict[str, Any], float]:
    """A scrape just after the agent's GPU-time meter ticked, and when: the counter moves in
    steps once a second, so a rate between two arbitrary scrapes is off by up to a step."""

    def batch_seconds(fams: dict[str, Any]) -> float:
        return value(fams, "sharegpu_tenant_gpu_busy_seconds", "_total", tenant="batch", gpu=uuid)

    start = batch_seconds(families(scrape_text(port)))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        fams = families(scrape_text(port))
        if batch_seconds(fams) != start:
            return fams, time.monotonic()
        time.sleep(0.02)
    raise AssertionError("the GPU-time meter never ticked")


def close(
    measured: dict[str, float],
    before: dict[str, float],
    after: dict[str, float],
    what: str,
    *,
    slack: float = 0.06,
) -> None:
    """Within `slack` of NVML, read just before and just after: the surface's window lies between
    the two. Two sources meet here: NVML's samples and the arbiter's charges, whose window edges
    are known to a quantum; on this VM they were seen 4.5 points apart over one second when
    idle and 7 in CI (batch 0.749 charged against NVML's 0.68), so the cross-check's own margin,
    10 points (what the agent reports as audit.compute_uncharged); the batch tenant's share
    itself moves by a few points from one second to the next."""
    for name, share in before.items():
        low, high = min(share, after[name]) - slack, max(share, after[name]) + slack
        assert low - 1e-9 <= measured[name] <= high + 1e-9, (
            f"{what}: {name} {measured[name]:.3f}, NVML {share:.3f} before and {after[name]:.3f} after"
        )
    assert sum(measured.values()) <= 1.0 + 1e-3, f"{what}: the tenants sum past the card: {measured}"


def measured_against_nvml(
    sim: Sim, pids: dict[str, int], read: Callable[[], dict[str, float]], what: str
) -> dict[str, float]:
    before = nvml_truth(sim, pids)
    measured = read()
    after = nvml_truth(sim, pids)
    print(f"{what}: {measured}; NVML {before} / {after}")
    close(measured, before, after, what)
    return before


@pytest.mark.timing
def test_every_surface_reports_the_gpu_time_nvml_measures(sim: Sim, tmp_path: Path) -> None:
    port = free_port()
    with running_agent(sim, tmp_path, "--metrics-port", str(port), "--metrics-address", "127.0.0.1") as agent:
        for name, priority in (("web", "online"), ("batch", "offline")):
            api(agent, "/v1/tenants", "POST", name=name, memory="64MiB", gpus=["0"], priority=priority)
        web_dir, batch_dir = (sim.runtime / "tenants" / n for n in ("web", "batch"))
        web = sim.spawn_probe("bursts", "1000", "30", "4", "1000", env=sim.tenant_env(web_dir))
        batch = sim.spawn_probe("saturate", "30", "1000", env=sim.tenant_env(batch_dir))
        pids = {"web": web.pid, "batch": batch.pid}
        try:
            time.sleep(2.5)
            first, t0 = at_meter_tick(port, sim.uuids()[0])
            truth_samples = []

            def cli() -> dict[str, float]:
                return by_tenant(
                    json.loads(sim.cli("tenants", "-o", "json").stdout)["items"], "gpu_busy_ratio"
                )

            def via_api() -> dict[str, float]:
                return by_tenant(api(agent, "/v1/tenants")["items"], "gpu_busy_ratio")

            def top() -> dict[str, float]:
                # Over a second, as NVML's: a charge's edges are known to a quantum (10 ms), which
                # over half a second moved batch 4 points (0.816 against NVML's 0.77-0.78).
                return top_compute(sim.cli("top", "--once", "--sample", "1").stdout)

            def devices() -> dict[str, float]:
                items = json.loads(sim.cli("devices", "-o", "json").stdout)["items"]
                (gpu0,) = [g for g in items if g["index"] == 0]
                return {"card": float(gpu0["compute_used_ratio"])}

            for _ in range(2):
                truth = measured_against_nvml(sim, pids, cli, "sharegpu tenants")
                assert 0.08 < truth["web"] < 0.2  # the bursts, not the token time it holds
                assert truth["batch"] > 0.6
                held = by_tenant(json.loads(sim.cli("tenants", "-o", "json").stdout)["items"], "held_ratio")
                print(f"token time (lifetime): {held}")
                truth_samples += [
                    truth,
                    measured_against_nvml(sim, pids, via_api, "the API"),
                    measured_against_nvml(sim, pids, top, "sharegpu top"),
                ]
                before, used, after = nvml_truth(sim, pids), devices(), nvml_truth(sim, pids)
                card = {"card": sum(before.values())}, {"card": sum(after.values())}
                close(used, *card, "sharegpu devices")
            last, t1 = at_meter_tick(port, sim.uuids()[0])
            elapsed = t1 - t0
            uuid = sim.uuids()[0]
            rate = {
                name: (
                    value(last, "sharegpu_tenant_gpu_busy_seconds", "_total", tenant=name, gpu=uuid)
                    - value(first, "sharegpu_tenant_gpu_busy_seconds", "_total", tenant=name, gpu=uuid)
                )
                / elapsed
                for name in pids
            }
            mean = {name: sum(s[name] for s in truth_samples) / len(truth_samples) for name in pids}
            print(f"metrics rate over {elapsed:.1f} s: {rate}, NVML mean {mean}")
            # The counters' rate over the whole window against the mean of six one-second NVML
            # samples taken inside it (seen: 0.775 against a mean of 0.755).
            close(rate, mean, mean, "the metrics", slack=0.03)  # over seconds: the edges weigh less
        finally:
            for proc in (web, batch):
                proc.kill()
                proc.communicate(timeout=30)


def _own_share(ends: list[int], burst_ns: int, t0: int, t1: int) -> float:
    """The kernel time a syncloop workload finished in [t0, t1] (CLOCK_MONOTONIC ns) over the
    window: the bursts whose sync returned inside it (each burst's kernels ended by then; the
    window's edges cut at most one burst of 4 ms per tenant)."""
    return sum(1 for e in ends if t0 < e <= t1) * burst_ns / (t1 - t0)


@pytest.mark.timing
def test_what_operators_see_is_what_the_workloads_got(sim: Sim, tmp_path: Path) -> None:
    """Two tenants that wait for their own work (4 x 1 ms, then cuCtxSynchronize; share 30/70):
    what `sharegpu tenants`, the API, the metrics and the arbiter's charge report for each is
    within 1 point of the kernel time the workload itself finished over the same window."""
    from sharegpu.arbiter import arbiter_path, read_arbiter

    port = free_port()
    uuid = sim.uuids()[0]
    with running_agent(sim, tmp_path, "--metrics-port", str(port), "--metrics-address", "127.0.0.1") as agent:
        for name, pct in (("a", "30%"), ("b", "70%")):
            api(
                agent,
                "/v1/tenants",
                "POST",
                name=name,
                memory="64MiB",
                gpus=["0"],
                compute=pct,
                policy="share",
            )
        start = time.monotonic_ns() + 1_000_000_000
        procs = {
            name: sim.spawn_probe(
                "syncloop",
                "12",
                "4",
                "1000",
                "20",
                str(start),
                "log",
                env=sim.tenant_env(sim.runtime / "tenants" / name),
            )
            for name in ("a", "b")
        }

        def counter(fams: dict[str, Any], name: str) -> float:
            return value(fams, "sharegpu_tenant_gpu_busy_seconds", "_total", tenant=name, gpu=uuid)

        def at_tick() -> tuple[dict[str, Any], int]:
            begin = counter(families(scrape_text(port)), "b")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                fams = families(scrape_text(port))
                if counter(fams, "b") != begin:
                    return fams, time.monotonic_ns()
                time.sleep(0.01)
            raise AssertionError("the GPU-time meter never ticked")

        def charged() -> tuple[dict[str, int], int]:
            at = time.monotonic_ns()  # the region is copied first; its walk may take a while
            status = read_arbiter(arbiter_path(sim.runtime, uuid))
            return {n: status.tenant(n).gpu_time_ns for n in ("a", "b")}, at  # type: ignore[union-attr]

        read_arbiter(arbiter_path(sim.runtime, uuid))  # its first call imports numpy

        try:
            time.sleep((start - time.monotonic_ns()) / 1e9 + 1.5)
            first, tick0 = at_tick()
            held0, at0 = charged()
            views = []
            for read in (
                lambda: json.loads(sim.cli("tenants", "-o", "json").stdout)["items"],
                lambda: api(agent, "/v1/tenants")["items"],
            ):
                before = time.monotonic_ns()
                items = read()
                views.append((by_tenant(items, "gpu_busy_ratio"), (before, time.monotonic_ns())))
                time.sleep(1.2)
            # The counter's window is known to a scrape's latency at each end (tens of ms on a
            # loaded machine): over 8 s that is a few tenths of a point.
            time.sleep(5.0)
            last, tick1 = at_tick()
            held1, at1 = charged()
            ends = {}
            for name, proc in procs.items():
                out, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
                ends[name] = [int(v) for k, v in parse_kv(out)[1] if k == "burst_end_ns"]
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate(timeout=30)
    burst = 4 * 1_000_000
    for name in ("a", "b"):
        own = _own_share(ends[name], burst, tick0, tick1)
        rate = (counter(last, name) - counter(first, name)) / ((tick1 - tick0) / 1e9)
        arb = (held1[name] - held0[name]) / (at1 - at0)
        own_arb = _own_share(ends[name], burst, at0, at1)
        print(f"{name}: workload {own:.3f}, metrics {rate:.3f}; workload {own_arb:.3f}, arbiter {arb:.3f}")
        assert abs(rate - own) <= 0.01, f"{name}: the metrics' rate {rate:.3f}, the workload {own:.3f}"
        assert abs(arb - own_arb) <= 0.01, (
            f"{name}: the arbiter's charge {arb:.3f}, the workload {own_arb:.3f}"
        )
        for (view, (asked, answered)), what in zip(views, ("sharegpu tenants", "the API"), strict=True):
            # The view's second ends between the request and its answer (tens of ms apart on a
            # loaded machine, when a 10 ms quantum moves a tenant's share of a second by a point):
            # the workload's own share over the seconds ending at each edge bounds it.
            edges = [_own_share(ends[name], burst, t - 1_000_000_000, t) for t in (asked, answered)]
            print(f"  {what}: {view[name]:.3f}, the workload over the same second {edges}")
            assert min(edges) - 0.01 <= view[name] <= max(edges) + 0.01, (
                f"{what}: {name} {view[name]:.3f}, workload {edges}"
            )
    assert 0.25 <= _own_share(ends["a"], burst, tick0, tick1) <= 0.35  # the shares themselves


@pytest.mark.timing
def test_tenants_in_their_own_pid_namespaces_are_told_apart(sim: Sim) -> None:
    """Two containers' processes, each pid 1 of a pid namespace with its own /proc: the GPU time
    `sharegpu tenants` shows for each is what each got (issue 36: two Podman containers that got
    39% and 60% were both shown 50%, the simulated NVML having summed every pid 1's work)."""
    tenants = {"a": compute_tenant(sim, "a", "share", 30), "b": compute_tenant(sim, "b", "share", 70)}
    at = start_at(0.8)
    # 6 s: the two CLI calls below (a Python start each, NVML's window, the table's two readings a
    # second apart) took until past a 4 s run's end on a loaded VM, and the table's rates then
    # covered the end of the work (b: 62% against 70%).
    procs = {
        name: spawn_in_pid_namespace(sim, path, "saturate", 6, 500, "kernel", at, mount_proc=True)
        for name, path in tenants.items()
    }
    time.sleep(0.8 + 1.5)
    # One reading (no agent): NVML's figure. The table's two readings: the arbiter's charges.
    items = json.loads(sim.cli("tenants", "-o", "json").stdout)["items"]
    table = sim.cli("tenants").stdout
    nvml = by_tenant(items, "gpu_busy_ratio")
    charged = {name: float(table_cell(table, "GPU TIME (", name).rstrip("%")) / 100 for name in tenants}
    got = {name: achieved(finish(proc)) / 100 for name, proc in procs.items()}
    print(f"own pid namespaces: NVML {nvml}, the charges {charged}, the workloads got {got}\n{table}")
    assert {t["devices"][0]["gpu_busy_source"] for t in items} == {"nvml"}
    for name in tenants:
        for what, shown in (("NVML", nvml), ("the charges", charged)):
            assert abs(shown[name] - got[name]) <= 0.05, (
                f"{name}: {what} {shown[name]:.3f}, got {got[name]:.3f}"
            )


def _keep_charge_at_zero(path: Path, tenant: str, stop: threading.Event) -> None:
    """What a tenant may do to the arbiter region it can write: keep its own charge at zero."""
    from sharegpu.regions import abi

    size = ctypes.sizeof(abi.ArbTenant)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as region:
        base = abi.Arbiter.tenants.offset
        (index,) = [
            i
            for i in range(abi.ARB_MAX_TENANTS)
            if abi.ArbTenant.from_buffer_copy(region, base + i * size).tenant_id == tenant.encode()
        ]
        charge = ctypes.c_uint64.from_buffer(region, base + index * size + abi.ArbTenant.gpu_time_ns.offset)
        try:
            while not stop.wait(0.002):
                charge.value = 0
        finally:
            del charge  # the mapping closes only once nothing points into it


def test_the_agent_reports_a_tenant_that_runs_past_its_charges(sim: Sim, tmp_path: Path) -> None:
    """NVML is the cross-check of the charges: a tenant that keeps rewriting its own charge in the
    arbiter region (which its processes can write) shows a GPU time near zero, and the agent
    reports it (`audit.compute_uncharged`) within a few seconds, and again when it stops; its
    honest neighbour is never reported."""
    from sharegpu.arbiter import arbiter_path

    uuid = sim.uuids()[0]
    with running_agent(sim, tmp_path) as agent:
        for name in ("rogue", "honest"):
            api(
                agent,
                "/v1/tenants",
                "POST",
                name=name,
                memory="64MiB",
                gpus=["0"],
                compute="50%",
                policy="share",
            )
        at = start_at(0.5)
        procs = [
            sim.spawn_probe(
                "saturate", "14", "500", "kernel", str(at), env=sim.tenant_env(sim.runtime / "tenants" / n)
            )
            for n in ("rogue", "honest")
        ]
        stop = threading.Event()
        try:
            time.sleep(2.0)  # both launched: their entries are made
            forger = threading.Thread(
                target=_keep_charge_at_zero, args=(arbiter_path(sim.runtime, uuid), "rogue", stop)
            )
            forger.start()
            started = time.monotonic()
            event = agent.wait_event("audit.compute_uncharged", "rogue", timeout=15)
            print(f"reported after {time.monotonic() - started:.1f} s: {event}")
            assert event["severity"] == "warning"
            assert event["gpu"] == uuid
            assert event["data"]["nvml_ratio"] > 0.3
            assert event["data"]["charged_ratio"] < 0.05
            (rogue,) = [t for t in api(agent, "/v1/tenants")["items"] if t["id"] == "rogue"]
            shown = rogue["devices"][0]
            print(f"the rogue's view: {shown}")
            assert shown["gpu_busy_source"] == "arbiter"
            assert shown["gpu_busy_ratio"] < 0.05
            assert shown["nvml_busy_ratio"] > 0.3  # the cross-check's figure, beside
            stop.set()
            forger.join()
            deadline = time.monotonic() + 10
            while not any(e["data"]["cleared"] for e in agent.events(kind="audit.compute_uncharged")):
                assert time.monotonic() < deadline, "never cleared once the charges were left alone"
                time.sleep(0.2)
            assert not [e for e in agent.events(kind="audit.compute_uncharged") if e["tenant"] == "honest"]
        finally:
            stop.set()
            for proc in procs:
                proc.kill()
                proc.communicate(timeout=30)


@pytest.mark.timing
def test_every_rate_of_a_tenants_row_is_over_one_window(sim: Sim) -> None:
    """Issue 36: GPU TIME was the last second, WAIT and THROTTLED the tenant's lifetime, so a
    tenant idle now showed "waiting 7%".  The table's rates are over the window its headers
    name; the lifetime shares are the wide table's "(LIFE)" columns."""
    tenants = {"a": compute_tenant(sim, "a", "share", 30), "b": compute_tenant(sim, "b", "share", 70)}
    at = start_at(0.5)
    procs = [
        sim.spawn_probe("saturate", "1.5", "500", "kernel", str(at), env=sim.tenant_env(p))
        for p in tenants.values()
    ]
    for proc in procs:
        finish(proc)
    table = sim.cli("tenants").stdout
    wide = sim.cli("tenants", "-o", "wide").stdout
    print(table, wide, sep="\n")
    assert re.search(r"WAIT \(\d+\.\ds\)", table), table  # the window measured, about a second
    assert re.search(r"THROTTLED \(\d+\.\ds\)", table), table
    for name in tenants:
        assert table_cell(table, "WAIT (", name) == "0.0%"  # idle now: nothing waited this second
        assert table_cell(table, "GPU TIME (", name) in ("0.0%", "-")
        assert float(table_cell(wide, "WAIT (LIFE)", name).rstrip("%")) > 5  # they did wait, earlier


@pytest.mark.timing
def test_an_offline_job_beside_an_online_service_pays_only_for_its_kernels(sim: Sim) -> None:
    """While an online service is active, the shim syncs offline work at each kernel (the in-flight
    bound), and the card idles from that kernel's end to the job's next launch: the bound's doing,
    not the job's work.  Charged to it, an offline job of 0.5 ms kernels beside a service of
    4 x 0.2 ms requests paid 1.2-1.3 points of the card more than it ran (76.5% charged, 75.2% run,
    2026-12-06); left out from the kernel's end, as at a sync of the program's, 0.1-0.2."""
    from sharegpu.arbiter import arbiter_path, read_arbiter

    web = compute_tenant(sim, "web", "share", 50, priority="online")
    batch = compute_tenant(sim, "batch", "share", 50, priority="offline")
    seconds = 3
    at = start_at(0.5)
    service = sim.spawn_probe("syncloop", str(seconds), "4", "200", "5000", str(at), env=sim.tenant_env(web))
    job = sim.spawn_probe("saturate", str(seconds), "500", "kernel", str(at), env=sim.tenant_env(batch))
    got = {"web": achieved(finish(service)), "batch": achieved(finish(job))}
    status = read_arbiter(arbiter_path(sim.runtime, sim.uuids()[0]))
    charged = {}
    for name in got:
        tenant = status.tenant(name)
        assert tenant is not None
        charged[name] = tenant.gpu_time_ns / (seconds * 1e9) * 100
    print(f"online service + offline job: ran {got}, charged {charged}, holdbacks {status.holdbacks}")
    assert got["batch"] > 50  # the job ran beside the service, bounded
    assert abs(charged["batch"] - got["batch"]) <= 0.7, (
        f"ran {got['batch']:.1f}%, charged {charged['batch']:.1f}%"
    )


@pytest.mark.timing
def test_an_online_request_that_waits_behind_an_offline_kernel_does_not_pay_for_it(sim: Sim) -> None:
    """Random online requests cannot be predicted, so each finds the offline job holding the card
    with a kernel in flight, and is granted at once (online_preempt early): its kernels queue
    behind that kernel.  The card ran the job's kernel until it ended, so that time is the job's:
    charged to the service, a service of 3 x 300 µs requests beside 2 ms kernels was charged
    20-27% of the card where its kernels ran 11-12% (2026-12-06).  The service pays for its
    kernels, the job for the rest, and every nanosecond once."""
    from sharegpu.arbiter import arbiter_path, read_arbiter

    web = compute_tenant(sim, "web", "share", 50, priority="online")
    batch = compute_tenant(sim, "batch", "share", 50, priority="offline")
    requests, kernels, kernel_us = 100, 3, 300
    at = start_at(0.5)
    job = sim.spawn_probe("saturate", "2.6", "1500", "kernel", str(at), env=sim.tenant_env(batch))
    service = sim.spawn_probe(
        "poisson",
        str(requests),
        "20",
        str(kernels),
        str(kernel_us),
        str(at + 200_000_000),
        env=sim.tenant_env(web),
    )
    ran = finish(service)
    job_got = achieved(finish(job))
    status = read_arbiter(arbiter_path(sim.runtime, sim.uuids()[0]))
    web_t, batch_t = status.tenant("web"), status.tenant("batch")
    assert web_t is not None
    assert batch_t is not None
    work_ms = requests * kernels * kernel_us / 1000
    charged_ms = web_t.gpu_time_ns / 1e6
    print(
        f"service: {work_ms:.0f} ms of kernels, charged {charged_ms:.1f} ms, p50 {ran['p50_us']} µs; "
        f"job ran {job_got:.1f}%, charged {batch_t.gpu_time_ns / 2.6e7:.1f}%; "
        f"early preemptions {status.early_preemptions}"
    )
    assert status.early_preemptions >= requests // 2  # the requests did find the job holding
    # Not short: the wait from its grant to its first launch, left out twice, charged it 2% less
    # than its kernels (87.8-88.4 ms of 90, 2026-12-07); over by the GPU's switch to it (~1%).
    assert 0.99 * work_ms <= charged_ms <= 1.10 * work_ms, (
        f"{work_ms:.0f} ms of kernels, charged {charged_ms:.1f} ms"
    )
    assert abs(batch_t.gpu_time_ns / 2.6e7 - job_got) <= 2, f"job ran {job_got:.1f}%"
