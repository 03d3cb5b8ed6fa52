"""Node agent costs: CPU and resident memory with 50 tenants on 8 simulated GPUs under load, and
API latency for create, resize and delete.

    python bench/agent.py [--tenants 50] [--gpus 8] [--seconds 20] [--json]

The agent runs as a real process (`sharegpu agent`) on a private simulated node. Every tenant is
created through its API and runs one process that holds memory; one tenant per GPU also runs
kernels back to back, so the arbiter and usage regions the agent reads keep changing. CPU is the
agent's user + system time over the measuring window (from /proc), divided by the window; memory
is its resident set (VmRSS) at the end. Goals (issue 4): under 2% of one core, under 100 MiB,
API p99 under 20 ms. All figures: simulated GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _node import Node, simulated_node
from sharegpu.agent.client import AgentClient
from sharegpu.native import LIB_DIR, probe_path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """VmRSS: everything resident, including the pages of the tenants' regions the agent maps
    (shared with the tenants); RssAnon: the agent's own memory."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round((len(ordered) - 1) * q))]


def loop_cpu(client: AgentClient) -> dict[str, float]:
    """CPU seconds each periodic loop's ticks have taken so far, as the agent counts them."""
    return {
        name: stats.cpu_seconds
        for name, stats in client.health().loops.items()
        if stats.cpu_seconds is not None
    }


def start_agent(node: Node, *extra: str) -> tuple[subprocess.Popen[str], AgentClient]:
    env = node.base_env | {"SHAREGPU_RUNTIME_DIR": str(node.root / "run")}
    exe = Path(sys.executable).with_name("sharegpu")
    cmd = [
        str(exe),
        "agent",
        "--runtime-dir",
        str(node.root / "run"),
        "--state-dir",
        str(node.root / "state"),
        # The node's CDI spec kept as in production, but in the bench's own directory: never
        # the real /var/run/cdi.
        "--cdi-spec",
        str(node.root / "cdi" / "sharegpu.json"),
        *extra,
    ]
    # Its log goes to a file: a pipe nobody reads would fill and block the agent.
    log = (node.root / "agent.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        client = AgentClient.connect(node.root / "run", timeout=1.0)
        if client is not None:
            return proc, client
        if proc.poll() is not None:
            raise RuntimeError(
                f"the agent exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the agent did not answer within 30 s")


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1000


def measure(tenants: int, gpus: int, seconds: float, *agent_args: str) -> dict[str, float]:
    with simulated_node(memory_mib=81920, gpus=gpus) as node:
        agent, client = start_agent(node, *agent_args)
        procs: list[subprocess.Popen[str]] = []
        latency: dict[str, list[float]] = {"create": [], "resize": [], "delete": [], "list": []}
        try:
            uuids = [g.uuid for g in client.list_gpus()]
            names = [f"t{i:02d}" for i in range(tenants)]
            for i, name in enumerate(names):
                policy = ("share", "cap", "burst")[i % 3]
                body = {
                    "name": name,
                    "memory": "1GiB",
                    "gpus": [uuids[i % len(uuids)]],
                    "compute": "5%" if policy != "share" else "10%",
                    "policy": policy,
                    "priority": ("online", "normal", "offline")[i % 3] if policy == "share" else "normal",
                    **({"ceiling": "20%"} if policy == "burst" else {}),
                }
                latency["create"].append(timed(lambda body=body: client.create_tenant(body)))
            shim = str(LIB_DIR / "libsharegpu.so")
            for i, name in enumerate(names):
                env = node.base_env | {
                    "LD_PRELOAD": shim,
                    "SHAREGPU_TENANT": str(node.root / "run" / "tenants" / name),
                }
                hold = ["hold", "plain", "64M", str(seconds + 30)]
                work = ["saturate", str(seconds + 30), "500", "kernel"]
                args = work if i < len(uuids) else hold
                procs.append(
                    subprocess.Popen(
                        [str(probe_path()), *args],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            time.sleep(3)  # every process started and is counted
            loops0 = loop_cpu(client)
            cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
            time.sleep(seconds)
            cpu = (cpu_seconds(agent.pid) - cpu0) / (time.monotonic() - t0)
            window = time.monotonic() - t0
            per_loop = {
                name: (spent - loops0.get(name, 0.0)) / window for name, spent in loop_cpu(client).items()
            }
            rss, anon = rss_mib(agent.pid), rss_mib(agent.pid, "RssAnon")
            for _ in range(20):
                latency["list"].append(timed(client.list_tenants))
            for name in names:
                latency["resize"].append(
                    timed(lambda name=name: client.resize_tenant(name, {"memory": "2GiB"}))
                )
                latency["resize"].append(
                    timed(lambda name=name: client.resize_tenant(name, {"memory": "1GiB"}))
                )
            for p in procs:
                p.kill()
                p.wait()
            for name in names:
                latency["delete"].append(timed(lambda name=name: client.delete_tenant(name, force=True)))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            client.close()
            agent.terminate()
            try:
                agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.kill()
        figures = {"cpu_core_pct": cpu * 100, "rss_mib": rss, "anon_mib": anon}
        figures |= {f"loop_{name}_cpu_pct": share * 100 for name, share in per_loop.items()}
        for op, values in latency.items():
            figures[f"{op}_p50_ms"] = statistics.median(values)
            figures[f"{op}_p99_ms"] = percentile(values, 0.99)
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="CPU measuring window")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    f = measure(args.tenants, args.gpus, args.seconds)
    # The same node without the metrics endpoint (and its once-a-second online-wait sampler):
    # what serving metrics costs, side by side.
    bare = measure(args.tenants, args.gpus, args.seconds, "--metrics-port", "0")
    f["cpu_core_pct_no_metrics"] = bare["cpu_core_pct"]
    if args.json:
        print(json.dumps(f, indent=2))
        return 0
    api_p99 = max(f[f"{op}_p99_ms"] for op in ("create", "resize", "delete"))
    rows = [
        ("agent CPU", f"{f['cpu_core_pct']:.2f}% of one core", "< 2%", f["cpu_core_pct"] < 2),
        (
            "  without metrics",
            f"{bare['cpu_core_pct']:.2f}% of one core",
            "< 2%",
            bare["cpu_core_pct"] < 2,
        ),
        ("agent resident memory", f"{f['rss_mib']:.1f} MiB", "< 100 MiB", f["rss_mib"] < 100),
        ("  of it private (anon)", f"{f['anon_mib']:.1f} MiB", "", None),
    ]
    for op in ("create", "resize", "delete", "list"):
        goal = op != "list"
        rows.append(
            (
                f"API {op}",
                f"p50 {f[f'{op}_p50_ms']:.2f} / p99 {f[f'{op}_p99_ms']:.2f} ms",
                "p99 < 20 ms" if goal else "",
                f[f"{op}_p99_ms"] < 20 if goal else None,
            )
        )
    print(
        f"Node agent — simulated GPU, {args.tenants} tenants on {args.gpus} GPUs, {args.seconds:g} s window"
    )
    print(f"{'figure':<24}{'measured':<34}{'goal':<14}met")
    print("-" * 76)
    for name, measured, goal, met in rows:
        print(f"{name:<24}{measured:<34}{goal:<14}{'' if met is None else 'yes' if met else 'NO'}")
    print(f"slowest API p99 over create/resize/delete: {api_p99:.2f} ms (goal < 20)")
    loops = sorted(
        ((k[len("loop_") : -len("_cpu_pct")], v) for k, v in f.items() if k.startswith("loop_")),
        key=lambda kv: -kv[1],
    )
    print()
    print("periodic loops' own CPU (thread time of their ticks), % of one core, metrics on:")
    print("  " + ", ".join(f"{name} {pct:.2f}" for name, pct in loops))
    print(
        f"  all loops {sum(v for _, v in loops):.2f} of the agent's {f['cpu_core_pct']:.2f} "
        "(the rest: the event loop, the API, the gpus and sync jobs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
