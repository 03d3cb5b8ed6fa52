"""GPU time as every surface reports it, against what NVML measures per process.

On the simulated GPU, NVML's per-process utilization is the truth (the engine knows which
process's kernel ran when). A bursty online tenant (4 x 1 ms every 30 ms, about 13% of the card)
holds the token far longer than the GPU runs for it; a saturating batch tenant takes the rest.
`sharegpu tenants`, `sharegpu top`, `sharegpu devices`, the API and the metrics must all report
GPU time within 2 points of NVML, and the tenants of the card never more than the whole card.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Sim
from test_metrics import api, families, free_port, running_agent, scrape_text, value

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


def close(measured: dict[str, float], before: dict[str, float], after: dict[str, float], what: str) -> None:
    """Within 3 points of NVML, read just before and just after: the surface's window lies
    between the two, and the batch tenant's share moves by a few points from one second to the
    next (on a loaded 2-core machine, `sharegpu top`'s half second read 0.73 between NVML's 0.69
    and 0.70: 2 points flaked)."""
    for name, share in before.items():
        low, high = min(share, after[name]) - 0.03, max(share, after[name]) + 0.03
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
                return top_compute(sim.cli("top", "--once", "--sample", "0.5").stdout)

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
            close(rate, mean, mean, "the metrics")
        finally:
            for proc in (web, batch):
                proc.kill()
                proc.communicate(timeout=30)
