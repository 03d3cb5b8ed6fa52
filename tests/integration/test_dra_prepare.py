"""The DRA plugin's prepare and unprepare (kube/dra/prepare.py, service.py) on the simulated GPU:
a claim is one tenant of the local tenant service, answered again from the checkpoint, removed at
unprepare; a plugin that really dies in the middle of a prepare is rolled back at its next start;
and one bad claim fails only itself.

Each step runs in a child Python process under the simulated GPU's environment (the plugin's NVML
is the simulated one, as the CDI spec's writer needs), with no agent: SHAREGPU_NO_AGENT=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Sim
from sharegpu.regions import liveness
from sharegpu.spec import MIB
from sharegpu.tenant import iter_tenants, read_device_limits, read_limits, read_meta

NODE = "node-a"
UID = "0f3c2a9e-1111-2222-3333-444455556666"
TENANT = "claim-0f3c2a9e-serve-gpu"
REF = ["default", "serve-gpu", UID]
OTHER_UID = "7b7b7b7b-0000-0000-0000-000000000000"
OTHER_TENANT = "claim-7b7b7b7b-train"
OTHER_REF = ["team-b", "train", OTHER_UID]
SHARE_0 = "5e0f9a7c-aaaa-bbbb-cccc-000000000000"
SHARE_1 = "5e0f9a7c-aaaa-bbbb-cccc-111111111111"

# The plugin, as far as a test drives it: a Preparer on the runtime directory of SHAREGPU_RUNTIME_DIR
# whose read_claim answers from the job's claims, running the job's steps in order; one JSON line
# per step: what it answered or its error, and the tenants and checkpoint after it. `die` makes the
# process end with os._exit(9) at one point of a prepare, as a killed plugin does.
PLUGIN = r"""
import json, os, sys
from pathlib import Path

from sharegpu.doors import tenant_service
from sharegpu.errors import SharegpuError
from sharegpu.kube.dra import dra_pb2 as dra
from sharegpu.kube.dra import prepare
from sharegpu.kube.dra.checkpoint import PREPARED, Checkpoint
from sharegpu.kube.dra.claims import ClaimRef
from sharegpu.kube.dra.service import DraService
from sharegpu.service import LocalTenantService, TenantRequest
from sharegpu.spec import MIB, ComputeSpec, GpuSelector
from sharegpu.tenant import iter_tenants, read_limits, read_meta, runtime_dir

job = json.loads(Path(sys.argv[1]).read_text())
checkpoint = Path(job["checkpoint"])


def die(*_args, **_kwargs):
    os._exit(9)


if job.get("die") == "after the tenant was made":  # the CDI spec is written right after it
    prepare.write_node_spec = die
elif job.get("die") == "recording it prepared":
    put = Checkpoint.put
    Checkpoint.put = lambda self, uid, entry: die() if entry.state == PREPARED else put(self, uid, entry)
elif job.get("die") == "making the tenant":
    LocalTenantService.create = die

def read_claim(ref):
    if ref.uid not in job["claims"]:
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=404, reason="Not Found")
    return job["claims"][ref.uid]


preparer = prepare.Preparer(
    node=job["node"],
    root=runtime_dir(),
    checkpoint=Checkpoint(checkpoint),
    read_claim=read_claim,
    cdi_spec=Path(job["cdi_spec"]) if job.get("cdi_spec") else None,
)


def state():
    tenants = {
        p.name: {"incarnation": int(read_limits(p).incarnation), "labels": read_meta(p).get("labels")}
        for p in iter_tenants(runtime_dir())
    }
    spec = preparer.cdi_spec
    spec = json.loads(spec.read_text())["devices"] if spec and spec.exists() else None
    return {
        "tenants": tenants,
        "checkpoint": json.loads(checkpoint.read_text()) if checkpoint.exists() else None,
        "spec": [d["name"] for d in spec] if spec is not None else None,
    }


for step, *args in job["steps"]:
    out = {"step": step}
    try:
        if step == "prepare":
            out["devices"] = preparer.prepare(ClaimRef(*args))
        elif step == "unprepare":
            preparer.unprepare(ClaimRef(*args))
        elif step == "recover":
            out["rolled"] = preparer.recover()
        elif step == "forget the checkpoint":
            checkpoint.unlink()
            preparer.checkpoint = Checkpoint(checkpoint)
        elif step == "tenant":  # another's tenant: name, MiB, GPU index, labels
            name, mib, index, labels = args
            with tenant_service(runtime_dir()) as service:
                gpus, compute = [GpuSelector(index=index)], ComputeSpec.parse(compute="10%")
                service.create(TenantRequest(name, mib * MIB, gpus, compute, labels=labels))
        elif step == "remove the tenant":  # behind the plugin's back (a reboot empties /run)
            with tenant_service(runtime_dir()) as service:
                service.delete(args[0], force=True)
        elif step == "serve":
            request = dra.NodePrepareResourcesRequest(
                claims=[dra.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in args]
            )
            response = DraService(preparer).NodePrepareResources(request, None)
            out["claims"] = {
                uid: {
                    "devices": [
                        {"device_name": d.device_name, "cdi_device_ids": list(d.cdi_device_ids),
                         "share_id": d.share_id if d.HasField("share_id") else None}
                        for d in answer.devices
                    ],
                    "error": answer.error,
                }
                for uid, answer in response.claims.items()
            }
        else:
            raise AssertionError(f"no step {step}")
    except SharegpuError as err:
        out["error"] = [type(err).__name__, str(err)]
    out.update(state())
    print(json.dumps(out), flush=True)
"""


def result(device: str, share: str, memory: str = "256Mi", compute: str = "30") -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": "sharegpu.io",
        "pool": NODE,
        "device": device,
        "shareID": share,
        "consumedCapacity": {"memory": memory, "compute": compute},
    }


def claim(
    ref: list[str], *results: dict[str, Any], priority: str = "online", pod: str = "serve-0"
) -> dict[str, Any]:
    """An allocated ResourceClaim as the API server sends it (resource.k8s.io/v1)."""
    namespace, name, uid = ref
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "4711"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "sharegpu.io"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": list(results or [result("gpu-0", SHARE_0)]),
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": ["gpu"],
                            "opaque": {
                                "driver": "sharegpu.io",
                                "parameters": {
                                    "apiVersion": "sharegpu.io/v1alpha1",
                                    "kind": "VgpuConfig",
                                    "priority": priority,
                                    "policy": "cap",
                                },
                            },
                        }
                    ],
                }
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"pod-uid-{pod}"}],
        },
    }


class Plugin:
    """Runs the plugin's steps in child processes that share the test's checkpoint and CDI spec."""

    def __init__(self, sim: Sim, tmp_path: Path, *claims: dict[str, Any], cdi_spec: bool = False):
        self.sim = sim
        self.tmp_path = tmp_path
        self.checkpoint = tmp_path / "state" / "dra-checkpoint.json"
        self.cdi_spec = tmp_path / "cdi" / "sharegpu.json" if cdi_spec else None
        self.claims = {c["metadata"]["uid"]: c for c in claims}
        self.runs = 0

    def start(self, *steps: list[Any], die: str | None = None) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        job = self.tmp_path / f"job-{self.runs}.json"
        job.write_text(
            json.dumps(
                {
                    "node": NODE,
                    "checkpoint": str(self.checkpoint),
                    "cdi_spec": str(self.cdi_spec) if self.cdi_spec else None,
                    "claims": self.claims,
                    "steps": [list(s) for s in steps],
                    "die": die,
                }
            )
        )
        return subprocess.run(
            [sys.executable, "-c", PLUGIN, str(job)],
            env=self.sim.env(SHAREGPU_NO_AGENT="1"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def run(self, *steps: list[Any]) -> list[dict[str, Any]]:
        """Each step's line; the process must end well."""
        proc = self.start(*steps)
        assert proc.returncode == 0, proc.stderr
        outs = [json.loads(line) for line in proc.stdout.splitlines()]
        assert [o["step"] for o in outs] == [s[0] for s in steps], proc.stderr
        return outs

    def entries(self) -> dict[str, Any]:
        return dict(json.loads(self.checkpoint.read_text())["claims"]) if self.checkpoint.exists() else {}

    def spec_devices(self) -> list[str]:
        assert self.cdi_spec is not None
        return [d["name"] for d in json.loads(self.cdi_spec.read_text())["devices"]]


def tenants(sim: Sim) -> dict[str, dict[str, Any]]:
    """The node's tenants, read from the runtime directory: incarnation, labels, limits."""
    return {
        p.name: {
            "incarnation": int(read_limits(p).incarnation),
            "labels": read_meta(p).get("labels"),
            "limits": [
                (d.uuid, d.mem_cap_bytes, d.share_permille, d.ceiling_permille) for d in read_device_limits(p)
            ],
        }
        for p in iter_tenants(sim.runtime)
    }


def answer(device: str, share: str, tenant: str = TENANT) -> dict[str, Any]:
    return {
        "request_names": ["gpu"],
        "pool_name": NODE,
        "device_name": device,
        "cdi_device_ids": [f"sharegpu.io/vgpu={tenant}"],
        "share_id": share,
    }


LABELS = {"namespace": "default", "claim": "serve-gpu", "claim_uid": UID, "pod": "serve-0"}


def test_a_prepared_claim_is_one_tenant_answered_again_from_the_checkpoint_and_removed_at_unprepare(
    sim: Sim, tmp_path: Path
) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF, result("gpu-0", SHARE_0), result("gpu-1", SHARE_1)))
    first, again = plugin.run(["prepare", *REF], ["prepare", *REF])
    assert "error" not in first, first
    assert first["devices"] == [answer("gpu-0", SHARE_0), answer("gpu-1", SHARE_1)]
    assert again["devices"] == first["devices"]
    assert again["tenants"] == first["tenants"]  # nothing made again: the same incarnation
    (made,) = tenants(sim).items()
    uuids = sim.uuids()
    assert made[0] == TENANT
    assert made[1]["labels"] == LABELS
    assert made[1]["limits"] == [(uuids[0], 256 * MIB, 300, 300), (uuids[1], 256 * MIB, 300, 300)]
    assert plugin.entries() == {
        UID: {
            "namespace": "default",
            "name": "serve-gpu",
            "tenant": TENANT,
            "state": "prepared",
            "devices": first["devices"],
        }
    }

    restarted, gone, unknown = plugin.run(["prepare", *REF], ["unprepare", *REF], ["unprepare", *OTHER_REF])
    assert restarted["devices"] == first["devices"]  # a new plugin process answers from the checkpoint
    assert restarted["tenants"] == first["tenants"]
    assert "error" not in gone, gone
    assert "error" not in unknown, unknown
    assert gone["tenants"] == {}
    assert gone["checkpoint"] == {"version": 1, "claims": {}}
    assert tenants(sim) == {}
    assert plugin.entries() == {}


def test_the_cdi_spec_lists_the_claims_device_from_prepare_to_unprepare(sim: Sim, tmp_path: Path) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF), cdi_spec=True)
    (prepared,) = plugin.run(["prepare", *REF])
    assert prepared["devices"] == [answer("gpu-0", SHARE_0)]
    assert TENANT in plugin.spec_devices()
    (unprepared,) = plugin.run(["unprepare", *REF])
    assert "error" not in unprepared, unprepared
    assert TENANT not in plugin.spec_devices()
    assert plugin.spec_devices()  # the node's shapes are still there


@pytest.mark.parametrize("moment", ["after the tenant was made", "recording it prepared"])
def test_a_plugin_killed_in_the_middle_of_a_prepare_is_rolled_back_at_its_next_start(
    sim: Sim, tmp_path: Path, moment: str
) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF), cdi_spec=True)
    died = plugin.start(["prepare", *REF], die=moment)
    assert died.returncode == 9, died.stderr
    assert died.stdout == ""  # it never answered
    entry = plugin.entries()[UID]
    assert (entry["state"], entry["tenant"]) == ("preparing", TENANT)
    before = tenants(sim)
    assert list(before) == [TENANT]

    recovered, prepared = plugin.run(["recover"], ["prepare", *REF])
    assert recovered["rolled"] == ["default/serve-gpu"]
    assert recovered["tenants"] == {}
    assert recovered["checkpoint"] == {"version": 1, "claims": {}}
    assert TENANT not in recovered["spec"]
    assert prepared["devices"] == [answer("gpu-0", SHARE_0)]
    (made,) = tenants(sim).items()
    assert made[0] == TENANT
    assert made[1]["labels"] == LABELS
    assert made[1]["incarnation"] != before[TENANT]["incarnation"]  # made once more, after the rollback
    assert plugin.entries()[UID]["state"] == "prepared"
    assert TENANT in plugin.spec_devices()


def test_a_plugin_killed_before_the_tenant_was_made_rolls_back_only_the_record(
    sim: Sim, tmp_path: Path
) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF))
    died = plugin.start(["prepare", *REF], die="making the tenant")
    assert died.returncode == 9, died.stderr
    assert plugin.entries()[UID]["state"] == "preparing"
    assert tenants(sim) == {}
    recovered, again = plugin.run(["recover"], ["recover"])
    assert recovered["rolled"] == ["default/serve-gpu"]
    assert again["rolled"] == []
    assert plugin.entries() == {}


def test_a_tenant_of_the_claims_name_that_is_another_claims_is_refused_and_left_alone(
    sim: Sim, tmp_path: Path
) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF))
    foreign = {"namespace": "default", "claim": "serve-gpu", "claim_uid": OTHER_UID}
    made, refused, unprepared = plugin.run(
        ["tenant", TENANT, 256, 0, foreign], ["prepare", *REF], ["unprepare", *REF]
    )
    assert "error" not in made, made
    kind, message = refused["error"]
    assert kind == "ClaimError"
    assert "claim default/serve-gpu" in message
    assert f"a tenant {TENANT} exists that is not this claim's" in message
    assert "\n" not in message
    assert refused["tenants"] == made["tenants"]  # the same incarnation, untouched
    assert refused["checkpoint"] is None or refused["checkpoint"]["claims"] == {}
    assert "error" not in unprepared  # and unprepare does not remove another's tenant either
    assert unprepared["tenants"] == made["tenants"]
    assert tenants(sim)[TENANT]["labels"] == foreign


def test_a_tenant_the_claims_own_prepare_made_is_taken_over_when_its_record_was_lost(
    sim: Sim, tmp_path: Path
) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF))
    first, _, again = plugin.run(["prepare", *REF], ["forget the checkpoint"], ["prepare", *REF])
    assert "error" not in again, again
    assert again["devices"] == first["devices"]
    assert again["tenants"] == first["tenants"]  # the same incarnation: not made twice
    assert plugin.entries()[UID]["state"] == "prepared"


def test_a_prepared_claim_whose_tenant_is_gone_is_prepared_again(sim: Sim, tmp_path: Path) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF))
    first, removed, again = plugin.run(["prepare", *REF], ["remove the tenant", TENANT], ["prepare", *REF])
    assert removed["tenants"] == {}
    assert removed["checkpoint"]["claims"][UID]["state"] == "prepared"
    assert again["devices"] == first["devices"]
    assert list(again["tenants"]) == [TENANT]
    assert again["tenants"][TENANT]["incarnation"] != first["tenants"][TENANT]["incarnation"]
    assert tenants(sim)[TENANT]["labels"] == LABELS


def test_a_claim_the_tenant_service_refuses_leaves_no_tenant_and_no_record(sim: Sim, tmp_path: Path) -> None:
    too_big = claim(REF, result("gpu-0", SHARE_0, memory="2Gi"))  # the simulated GPUs have 1 GiB
    refused_by_admission = claim(OTHER_REF, result("gpu-0", SHARE_1), pod="train-0")
    plugin = Plugin(sim, tmp_path, too_big, refused_by_admission)
    whole = {"owner": "someone"}
    made, big, full = plugin.run(
        ["tenant", "batch", sim.memory_mib, 0, whole], ["prepare", *REF], ["prepare", *OTHER_REF]
    )
    assert "error" not in made, made
    for out, claim_key, fragment in (
        (big, "default/serve-gpu", "to the device's 1024 MiB"),
        (full, "team-b/train", "would total 1.25GiB of the card's 1GiB"),
    ):
        kind, message = out["error"]
        assert kind == "ClaimError", out
        assert f"claim {claim_key}" in message
        assert fragment in message
        assert "\n" not in message
        assert list(out["tenants"]) == ["batch"]
        assert out["checkpoint"] is None or out["checkpoint"]["claims"] == {}
    assert tenants(sim)["batch"]["labels"] == whole
    assert plugin.entries() == {}


def test_a_cdi_spec_that_cannot_be_written_undoes_the_prepare(sim: Sim, tmp_path: Path) -> None:
    plugin = Plugin(sim, tmp_path, claim(REF), cdi_spec=True)
    assert plugin.cdi_spec is not None
    owner = plugin.cdi_spec.with_name(f".{plugin.cdi_spec.name}.owner")
    owner.parent.mkdir(parents=True)
    # The spec is another runtime directory's, whose sharegpu (this test's process) is alive.
    me = os.getpid()
    owner.write_text(
        json.dumps({"runtime_dir": "/elsewhere", "pid": me, "start_time": liveness.start_time(me)})
    )
    (refused,) = plugin.run(["prepare", *REF])
    kind, message = refused["error"]
    assert kind == "ClaimError"
    assert "claim default/serve-gpu: cannot write the CDI spec" in message
    assert "/elsewhere" in message
    assert refused["tenants"] == {}
    assert plugin.entries() == {}


def test_one_bad_claim_in_a_kubelet_request_fails_only_itself(sim: Sim, tmp_path: Path) -> None:
    bad = claim(OTHER_REF, result("gpu-1", SHARE_1, compute="0"), pod="train-0")
    gone = ["team-c", "deleted", "c0c0c0c0-0000-0000-0000-000000000000"]  # the API server has none
    plugin = Plugin(sim, tmp_path, claim(REF), bad)
    (served,) = plugin.run(["serve", OTHER_REF, REF, gone])
    assert set(served["claims"]) == {UID, OTHER_UID, gone[2]}
    assert served["claims"][UID] == {
        "devices": [
            {"device_name": "gpu-0", "cdi_device_ids": [f"sharegpu.io/vgpu={TENANT}"], "share_id": SHARE_0}
        ],
        "error": "",
    }
    refused = served["claims"][OTHER_UID]
    assert refused["devices"] == []
    assert refused["error"] == (
        "claim team-b/train: compute 0 on device gpu-1 must be a whole percent from 1 to 100"
    )
    unreadable = served["claims"][gone[2]]
    assert unreadable["devices"] == []
    assert "claim team-c/deleted" in unreadable["error"]
    assert "404" in unreadable["error"]
    assert list(served["tenants"]) == [TENANT]
    assert list(plugin.entries()) == [UID]
