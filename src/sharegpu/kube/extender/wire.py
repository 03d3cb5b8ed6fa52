"""The extender API's JSON shapes (kube-scheduler's ExtenderArgs, ExtenderFilterResult,
ExtenderPreemptionArgs/Result), and the one-line reasons built from them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from sharegpu.kube.inventory import node_name
from sharegpu.placement import Request


def filter_result(
    nodes: list[Mapping[str, Any]], fits: list[str], failed: dict[str, str], final: dict[str, str]
) -> dict[str, Any]:
    """ExtenderFilterResult: the nodes in the form they came (objects, or names when the
    extender is node-cache capable)."""
    keep = set(fits)
    return {
        "Nodes": {"items": [n for n in nodes if node_name(n) in keep]} if nodes else None,
        "NodeNames": None if nodes else fits,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": final,
        "Error": "",
    }


def for_scheduler(reply: Any) -> Any:
    """A verb's reply with its reasons as the kube-scheduler shows them. The scheduler hands the
    extender's reasons to its event recorder as a format string, so "10% GPU" reached a pod's
    events as "10%!G(MISSING)PU" (seen on the real node: tests/e2e/test_kube_real_sharegpu.py);
    the reasons say "percent" instead."""
    if not isinstance(reply, dict):
        return reply
    out = dict(reply)
    for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
        if isinstance(out.get(key), dict):
            out[key] = {node: _words(str(why)) for node, why in out[key].items()}
    if isinstance(out.get("Error"), str):
        out["Error"] = _words(out["Error"])
    return out


def _words(reason: str) -> str:
    return reason.replace("%", " percent")


def unschedulable(request: Request, failed: Mapping[str, str], final: Mapping[str, str]) -> str:
    """Why no node can take the request, in one line: the commonest reasons, counted."""
    counts = Counter([*failed.values(), *final.values()])
    if not counts:
        return f"no node to place {request.describe()} on: the scheduler passed none"
    shown = "; ".join(f"{n} node(s): {reason}" for reason, n in counts.most_common(3))
    more = f"; {len(counts) - 3} other reason(s)" if len(counts) > 3 else ""
    return f"no node can take {request.describe()} now. {shown}{more}"


def victims(args: Mapping[str, Any]) -> dict[str, tuple[list[str], int]]:
    """{node: (victim pod uids, PDB violations)} from NodeNameToMetaVictims (a node-cache
    capable extender's) or NodeNameToVictims (whole pods)."""
    out: dict[str, tuple[list[str], int]] = {}
    for node, victims in (args.get("NodeNameToVictims") or {}).items():
        pods = (victims or {}).get("Pods") or []
        uids = [str((p.get("metadata") or {}).get("uid", "")) for p in pods]
        out[node] = (uids, int((victims or {}).get("NumPDBViolations") or 0))
    for node, victims in (args.get("NodeNameToMetaVictims") or {}).items():
        pods = (victims or {}).get("Pods") or []
        out[node] = ([str(p.get("UID", "")) for p in pods], int((victims or {}).get("NumPDBViolations") or 0))
    return out


def meta_victims(uids: list[str], pdb: int) -> dict[str, Any]:
    """MetaVictims; the PDB count is the scheduler's, an upper bound once victims are dropped."""
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}


def resource_version(text: object) -> int | None:
    """A resourceVersion as a number, to tell older from newer. The API server calls them
    opaque; etcd-backed ones are numbers. Any other is never compared (events apply as they come)."""
    try:
        return int(str(text))
    except ValueError:
        return None
