"""deploy/kubernetes/: the manifests `kubectl apply -k` installs, rendered by `kubectl kustomize`.

Every object valid against the Kubernetes 1.30 and 1.34 schemas (strict: no unknown field); the
ServiceMonitor (a custom resource) and the scheduler's configuration (inside a ConfigMap), which
those schemas lack, checked field by field. Then what matters of them: each component's RBAC is
exactly what it needs, every container has resource requests, the images are pinned, the
agent's flags and probes work against a real agent, and the examples are pods sharegpu reads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agentutil import Agent
from conftest import Sim
from sharegpu import native
from sharegpu.kube.deviceplugin import registration
from sharegpu.kube.dra import registration as dra_registration
from sharegpu.kube.dra.__main__ import _parser as dra_parser
from sharegpu.kube.dra.claims import CONFIG_API, CONFIG_KEYS, CONFIG_KIND
from sharegpu.kube.dra.slices import DRIVER
from sharegpu.kube.request import PRIORITY_CLASSES, RESOURCES

REPO = Path(__file__).parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
BASE = KUBERNETES  # what `kubectl apply -k deploy/kubernetes` installs: base/
MONITORING = KUBERNETES / "monitoring"
KIND = KUBERNETES / "kind"
KIND_DRA = KUBERNETES / "kind-dra"
DRA = KUBERNETES / "dra"
EXAMPLES = KUBERNETES / "examples"
DASHBOARD = REPO / "deploy" / "grafana" / "sharegpu.json"
NAMESPACE = "sharegpu-system"
KUBE_VERSIONS = ("1.30", "1.34")
IMAGE = "ghcr.io/sharegpu/sharegpu"
SCHEDULER_NAME = "sharegpu-scheduler"
# Not in the Kubernetes schemas: checked by hand below.
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor")}

Obj = dict[str, Any]


@cache
def render(directory: Path) -> tuple[Obj, ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI"):
            # The CI image has it; Debian's kubernetes-client (1.20) is too old for these
            # kustomizations (kustomize v5: kubectl 1.27 or later), so .ci/run cannot install it.
            pytest.fail("kubectl is not installed: the CI image has it, so this is a broken install")
        pytest.skip("kubectl not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, f"kubectl kustomize {directory} failed:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def examples() -> list[Obj]:
    return [d for f in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def one(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def generated(objs: tuple[Obj, ...], kind: str, prefix: str) -> Obj:
    """An object kustomize generated, its name `prefix` plus a hash."""
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, f"{len(found)} {kind} named {prefix}*"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"] if workload["kind"] == "Pod" else workload["spec"]["template"]["spec"]
    return spec


def containers(objs: tuple[Obj, ...] | list[Obj]) -> list[tuple[str, Obj]]:
    workloads = [o for o in objs if o["kind"] in ("Pod", "Deployment", "DaemonSet")]
    return [
        (f"{w['kind']}/{w['metadata']['name']}/{c['name']}", c)
        for w in workloads
        for c in pod_spec(w).get("initContainers", []) + pod_spec(w)["containers"]
    ]


def scheduler_config() -> Obj:
    config: Obj = yaml.safe_load(
        generated(render(BASE), "ConfigMap", "sharegpu-scheduler-config-")["data"]["config.yaml"]
    )
    return config


# ---------------------------------------------------------------------------------------------
# Valid objects.


def test_the_base_holds_the_components_and_the_overlay_adds_monitoring() -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in render(BASE)}
    for want in [
        ("Namespace", NAMESPACE),
        ("DaemonSet", "sharegpu-node"),
        ("Deployment", "sharegpu-extender"),
        ("Service", "sharegpu-extender"),
        ("Deployment", "sharegpu-scheduler"),
        ("Service", "sharegpu-node-metrics"),
        *(("PriorityClass", name) for name in PRIORITY_CLASSES),
    ]:
        assert want in names
    # A plain cluster has no ServiceMonitor CRD: the base must apply without one.
    assert not {(o["apiVersion"], o["kind"]) for o in render(BASE)} & CUSTOM
    added = {(o["kind"], o["metadata"]["name"]) for o in render(MONITORING)} - names
    assert added == {("ServiceMonitor", "sharegpu-node"), ("ConfigMap", "sharegpu-dashboard")}
    for o in render(MONITORING):
        if o["metadata"].get("namespace") is not None or o["kind"] not in (
            "Namespace",
            "PriorityClass",
            "ClusterRole",
            "ClusterRoleBinding",
        ):
            where = OUTSIDE_NAMESPACE.get((o["kind"], o["metadata"]["name"]), NAMESPACE)
            assert o["metadata"].get("namespace") == where, f"{o['kind']}/{o['metadata']['name']}"


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_is_valid_for_kubernetes(version: str) -> None:
    objs = [*render(MONITORING), *examples(), one(render(KIND), "DaemonSet", "sharegpu-node")]
    checked = 0
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}: {err.message}")
        checked += 1
    assert checked == len(objs) - 1  # all but the ServiceMonitor


@pytest.mark.parametrize(("overlay", "base"), [(KIND, BASE), (KIND_DRA, DRA)], ids=["kind", "kind-dra"])
def test_the_kind_overlays_run_the_node_on_the_simulated_gpu_at_the_images_paths(
    overlay: Path, base: Path
) -> None:
    """The CDI spec names the simulated driver by the package's path in the image, and the node's
    runtime mounts it from the node: so the overlay puts the image's libraries on the node at
    that path, and every container of the node (the agent and its kubelet plugin, of either
    mode) uses them from there."""
    names = {(o["kind"], o["metadata"]["name"]) for o in render(base)}
    assert {(o["kind"], o["metadata"]["name"]) for o in render(overlay)} == names
    spec = pod_spec(one(render(overlay), "DaemonSet", "sharegpu-node"))
    plain = pod_spec(one(render(base), "DaemonSet", "sharegpu-node"))
    assert sorted(c["name"] for c in spec["containers"]) == sorted(c["name"] for c in plain["containers"])
    containerfile = (REPO / "deploy" / "image" / "Containerfile").read_text()
    python = re.search(r"ARG PYTHON=(\d+\.\d+)-", containerfile)
    assert python is not None
    lib = f"/usr/local/lib/python{python[1]}/site-packages/sharegpu/_lib"
    (volume,) = [v for v in spec["volumes"] if v["name"] == "sharegpu-lib"]
    assert volume["hostPath"]["path"] == lib
    (init,) = spec["initContainers"]
    assert f"cp -a --remove-destination {lib}/. /node-lib/" in init["command"][-1]
    assert (native.LIB_DIR / "simgpu" / "libcuda.so.1").exists()  # what LD_LIBRARY_PATH names, in the package
    for container in spec["containers"]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["LD_LIBRARY_PATH"] == f"{lib}/simgpu", container["name"]
        assert env["SIMGPU_STATE"].startswith("/run/sharegpu/")  # the runtime directory, a hostPath
        assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]}[lib] == "sharegpu-lib"


def test_the_schemas_catch_a_misspelt_field() -> None:
    daemonset = json.loads(json.dumps(one(render(BASE), "DaemonSet", "sharegpu-node")))
    pod_spec(daemonset)["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBE_VERSIONS[0], strict=True)


def test_the_service_monitor_scrapes_the_agents_metrics_port() -> None:
    objs = render(MONITORING)
    monitor = one(objs, "ServiceMonitor", "sharegpu-node")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    spec = monitor["spec"]
    assert set(spec) <= {"namespaceSelector", "selector", "endpoints"}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    services = [
        s
        for s in objs
        if s["kind"] == "Service"
        and s["metadata"]["namespace"] == NAMESPACE
        and spec["selector"]["matchLabels"].items() <= s["metadata"].get("labels", {}).items()
    ]
    assert [s["metadata"]["name"] for s in services] == ["sharegpu-node-metrics"]
    (endpoint,) = spec["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "relabelings"}
    (port,) = [p for p in services[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["port"] == 9479
    assert endpoint["path"] == "/metrics"
    # The dashboard's node variable is `instance`: the node's name, not a pod's address.
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"}
    ]
    assert "label_values(sharegpu_build_info, instance)" in DASHBOARD.read_text()


def test_services_select_their_pods() -> None:
    objs = render(BASE)
    for service in [o for o in objs if o["kind"] == "Service"]:
        selector = service["spec"]["selector"]
        pods = [w for w in objs if w["kind"] in ("Deployment", "DaemonSet")]
        chosen = [w for w in pods if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(chosen) == 1, service["metadata"]["name"]
        names = {p["name"] for c in pod_spec(chosen[0])["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in names


# ---------------------------------------------------------------------------------------------
# The scheduler and its extender.


def test_the_scheduler_configuration_calls_the_extender_for_sharegpu_resources() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) == {"apiVersion", "kind", "leaderElection", "profiles", "extenders"}
    assert config["profiles"] == [{"schedulerName": SCHEDULER_NAME}]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceNamespace": NAMESPACE,
        "resourceName": SCHEDULER_NAME,
    }
    (extender,) = config["extenders"]
    assert extender == {
        "urlPrefix": "http://sharegpu-extender.sharegpu-system.svc:8998",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 5,
        "enableHTTPS": False,
        "httpTimeout": "5s",
        "nodeCacheCapable": True,
        "ignorable": False,
        "managedResources": [
            {"name": "sharegpu.io/vgpu", "ignoredByScheduler": False},
            {"name": "sharegpu.io/vgpu-memory", "ignoredByScheduler": True},
            {"name": "sharegpu.io/vgpu-compute", "ignoredByScheduler": True},
        ],
    }
    assert [r["name"] for r in extender["managedResources"]] == list(RESOURCES)


def test_the_extender_url_is_its_service() -> None:
    objs = render(BASE)
    url = scheduler_config()["extenders"][0]["urlPrefix"]
    service = one(objs, "Service", "sharegpu-extender")
    (port,) = service["spec"]["ports"]
    assert (
        url == f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port['port']}"
    )
    extender = one(objs, "Deployment", "sharegpu-extender")
    (container,) = pod_spec(extender)["containers"]
    assert container["command"] == ["python", "-m", "sharegpu.kube.extender"]
    assert container["args"] == [f"--port={port['port']}"]
    assert extender["spec"]["replicas"] == 2
    # Only the leader is ready, so the Service reaches it alone; the probes are the command's own.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_the_scheduler_runs_its_configuration() -> None:
    objs = render(BASE)
    config = generated(objs, "ConfigMap", "sharegpu-scheduler-config-")
    scheduler = one(objs, "Deployment", "sharegpu-scheduler")
    spec = pod_spec(scheduler)
    (volume,) = spec["volumes"]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    (container,) = spec["containers"]
    (mount,) = container["volumeMounts"]
    assert container["command"][-1] == f"--config={mount['mountPath']}/config.yaml"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}


# ---------------------------------------------------------------------------------------------
# RBAC: exactly what each component needs.


# Roles the cluster has without a system: prefix (kube-system's, made by the API server).
CLUSTER_ROLES_ELSEWHERE = ("extension-apiserver-authentication-reader",)
# The one object outside sharegpu-system: the scheduler's binding to kube-system's role that
# reads the API server's client CA (what its secure port authenticates with).
OUTSIDE_NAMESPACE = {("RoleBinding", "sharegpu-scheduler-authentication-reader"): "kube-system"}


def permissions(objs: tuple[Obj, ...], account: str) -> tuple[set[tuple[str, ...]], set[str]]:
    """What the ServiceAccount is granted by our roles, as (scope, group, resource, verb[,
    name]) tuples, and the names of the cluster's own roles it is bound to."""
    ours = {(o["kind"], o["metadata"]["name"]): o for o in objs if o["kind"] in ("Role", "ClusterRole")}
    granted: set[tuple[str, ...]] = set()
    builtin: set[str] = set()
    for binding in [o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        role = ours.get((ref["kind"], ref["name"]))
        scope = binding["metadata"].get("namespace", "cluster")
        if role is None:
            known = ref["name"].startswith("system:") or ref["name"] in CLUSTER_ROLES_ELSEWHERE
            assert known, f"{binding['metadata']['name']}: no role {ref['name']}"
            builtin.add(ref["name"] if scope == "cluster" else f"{scope}/{ref['name']}")
            continue
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames", [None]):
                            granted.add((scope, group, resource, verb, *([name] if name else [])))
    return granted, builtin


def test_the_node_component_may_read_pods_and_patch_its_node() -> None:
    granted, builtin = permissions(render(BASE), "sharegpu-node")
    assert builtin == set()
    assert granted == {
        *(("cluster", "", "pods", verb) for verb in ("get", "list", "watch", "patch")),
        ("cluster", "", "nodes", "get"),
        ("cluster", "", "nodes", "patch"),
        ("cluster", "", "events", "create"),
    }


def test_the_extender_may_bind_and_hold_its_lease() -> None:
    granted, builtin = permissions(render(BASE), "sharegpu-extender")
    assert builtin == set()
    assert granted == {
        *(("cluster", "", "pods", verb) for verb in ("get", "list", "watch", "patch")),
        ("cluster", "", "pods/binding", "create"),
        *(("cluster", "", "nodes", verb) for verb in ("get", "list", "watch")),
        ("cluster", "", "events", "create"),
        *((NAMESPACE, "coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")),
    }


def test_the_scheduler_has_the_kube_schedulers_roles_and_its_own_lease() -> None:
    granted, builtin = permissions(render(BASE), "sharegpu-scheduler")
    assert builtin == {
        "system:kube-scheduler",
        "system:volume-scheduler",
        "kube-system/extension-apiserver-authentication-reader",
    }
    assert granted == {
        (NAMESPACE, "coordination.k8s.io", "leases", "create"),
        (NAMESPACE, "coordination.k8s.io", "leases", "get", SCHEDULER_NAME),
        (NAMESPACE, "coordination.k8s.io", "leases", "update", SCHEDULER_NAME),
    }


# ---------------------------------------------------------------------------------------------
# Containers, images, priorities.


def test_every_container_requests_cpu_and_memory_and_limits_memory() -> None:
    listed = containers(render(BASE)) + containers(examples())
    assert len(listed) == 6
    for where, container in listed:
        resources = container.get("resources", {})
        assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
        assert "memory" in resources.get("limits", {}), where


@pytest.mark.parametrize("install", [BASE, MONITORING, KIND, DRA, KIND_DRA], ids=lambda p: p.name)
def test_every_container_of_every_install_runs_a_pinned_image(install: Path) -> None:
    """Each container, those an overlay adds among them, runs an image with the tag the base's
    kustomization pins (a container without one would run whatever `:latest` is)."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    pinned = {f"{IMAGE}:{version}", "registry.k8s.io/kube-scheduler:v1.30.14"}
    images = {name: c["image"] for name, c in containers(render(install))}
    assert {name: image for name, image in images.items() if image not in pinned} == {}


def test_the_images_are_pinned_by_the_kustomization() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    images = {c["image"] for _, c in containers(render(MONITORING))}
    assert images == {f"{IMAGE}:{version}", "registry.k8s.io/kube-scheduler:v1.30.14"}
    # ... and only there: the manifests name no tag of their own.
    for path in (KUBERNETES / "base").glob("*.yaml"):
        if path.name != "kustomization.yaml":
            for line in path.read_text().splitlines():
                if line.strip().startswith("image:"):
                    assert ":" not in line.split("image:")[1], f"{path.name}: {line.strip()}"


def test_the_priority_classes_are_the_ones_sharegpu_reads() -> None:
    objs = render(BASE)
    classes = {name: one(objs, "PriorityClass", name) for name in PRIORITY_CLASSES}
    online, normal, offline = (classes[f"sharegpu-{p}"] for p in ("online", "normal", "offline"))
    assert online["value"] > normal["value"] == 0 > offline["value"]
    assert offline["preemptionPolicy"] == "Never"
    assert "preemptionPolicy" not in online  # the default: it may preempt lower pods
    assert not any(c.get("globalDefault") for c in classes.values())


def test_the_dashboard_config_map_is_the_dashboard() -> None:
    config_map = one(render(MONITORING), "ConfigMap", "sharegpu-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {"sharegpu.json": DASHBOARD.read_text()}, (
        "deploy/kubernetes/monitoring/sharegpu.json is stale: "
        "cp deploy/grafana/sharegpu.json deploy/kubernetes/monitoring/"
    )


# ---------------------------------------------------------------------------------------------
# The node component.


def node_daemonset() -> Obj:
    return one(render(BASE), "DaemonSet", "sharegpu-node")


def node_container(name: str) -> Obj:
    container: Obj = next(c for c in pod_spec(node_daemonset())["containers"] if c["name"] == name)
    return container


def test_the_node_component_runs_on_gpu_nodes_with_the_hosts_pids_and_paths() -> None:
    spec = pod_spec(node_daemonset())
    assert spec["hostPID"] is True
    assert spec["nodeSelector"] == {"sharegpu.io/gpu": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert spec["serviceAccountName"] == "sharegpu-node"
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert host == {
        "runtime": "/run/sharegpu",
        "state": "/var/lib/sharegpu",
        "cdi": "/var/run/cdi",
        "device-plugins": "/var/lib/kubelet/device-plugins",
    }
    for container in spec["containers"]:
        env = {e["name"]: e for e in container["env"]}
        assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        for mount in container["volumeMounts"]:
            # The same path inside as on the host: the CDI spec and the tenants' files name host paths.
            assert mount["mountPath"] == host[mount["name"]], container["name"]
    assert node_container("agent")["securityContext"] == {"privileged": True}
    plugin = node_container("device-plugin")
    assert plugin["command"] == ["python", "-m", "sharegpu.kube.deviceplugin"]
    assert "args" not in plugin  # --node is $NODE_NAME; the kubelet's directory and the spec: defaults
    assert Path(host["device-plugins"]) == registration.DEFAULT_DIR
    # Its probes look for the socket it serves the kubelet on.
    socket = f"{host['device-plugins']}/{registration.ENDPOINT}"
    for probe in ("readinessProbe", "livenessProbe"):
        assert plugin[probe]["exec"]["command"] == ["test", "-S", socket]


def test_the_agents_flags_are_the_agents() -> None:
    agent = node_container("agent")
    assert agent["command"] == ["sharegpu", "agent"]
    out = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "agent", *agent["args"], "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("SHAREGPU_")},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    settings = {line.split(":")[0]: line.split()[1] for line in out.stdout.splitlines()[1:]}
    assert settings["runtime_dir"] == "/run/sharegpu"
    assert settings["state_dir"] == "/var/lib/sharegpu"
    assert settings["cdi_spec"] == "/var/run/cdi/sharegpu.json"
    assert settings["metrics_port"] == "9479"
    assert settings["log_format"] == "json"
    (port,) = agent["ports"]
    assert port == {"name": "metrics", "containerPort": 9479}


def _health_probe(socket_path: Path) -> list[str]:
    """The agent's probe, run by this Python against `socket_path`."""
    agent = node_container("agent")
    probes = [agent[p]["exec"]["command"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert probes[0] == probes[1] == probes[2]
    command = list(probes[0])
    assert command[0] == "python"
    assert "'/run/sharegpu/agent.sock'" in command[-1]
    return [sys.executable, *command[1:-1], command[-1].replace("/run/sharegpu/agent.sock", str(socket_path))]


def test_the_agents_probe_passes_on_a_running_agent_and_fails_without_one(sim: Sim, tmp_path: Path) -> None:
    probe = _health_probe(sim.runtime / "agent.sock")
    down = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    assert down.returncode != 0
    agent = Agent(sim, tmp_path / "state").start()
    try:
        assert agent.sock == sim.runtime / "agent.sock"
        up = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
        assert up.returncode == 0, up.stderr
    finally:
        agent.close()


# ---------------------------------------------------------------------------------------------
# DRA mode (deploy/kubernetes/dra).


def test_the_dra_overlay_is_the_node_and_the_device_classes_without_extender_or_scheduler() -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in render(BASE)}
    dra = {(o["kind"], o["metadata"]["name"]) for o in render(DRA)}
    assert dra - base == {
        ("DeviceClass", "vgpu.sharegpu.io"),
        ("DeviceClass", "online.vgpu.sharegpu.io"),
        ("ClusterRole", "sharegpu-dra"),
        ("ClusterRoleBinding", "sharegpu-dra"),
    }
    gone = base - dra
    assert gone
    assert all(re.match(r"sharegpu-(extender|scheduler)", name) for _, name in gone), gone
    assert ("DaemonSet", "sharegpu-node") in dra
    assert sorted(name for name, _ in containers(render(DRA))) == [
        "DaemonSet/sharegpu-node/agent",
        "DaemonSet/sharegpu-node/dra-plugin",
    ]


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_the_dra_objects_and_examples_are_valid_for_kubernetes(version: str) -> None:
    dra_examples = [
        d for f in sorted((EXAMPLES / "dra").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
    ]
    assert len(dra_examples) >= 6
    for obj in [*render(DRA), *dra_examples]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}: {err.message}")


def test_the_device_classes_select_the_driver_and_the_online_class_configures_it() -> None:
    classes = {o["metadata"]["name"]: o["spec"] for o in render(DRA) if o["kind"] == "DeviceClass"}
    for spec in classes.values():
        assert spec["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    (config,) = classes["online.vgpu.sharegpu.io"]["config"]
    params = config["opaque"]["parameters"]
    assert config["opaque"]["driver"] == DRIVER
    assert (params["apiVersion"], params["kind"], params["priority"]) == (CONFIG_API, CONFIG_KIND, "online")
    assert set(params) - {"apiVersion", "kind"} <= set(CONFIG_KEYS)


def test_the_dra_plugin_runs_with_the_kubelets_directories_and_its_flags() -> None:
    (daemonset,) = [o for o in render(DRA) if o["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    (plugin,) = [c for c in spec["containers"] if c["name"] == "dra-plugin"]
    assert plugin["command"] == ["python", "-m", "sharegpu.kube.dra"]
    args = dra_parser().parse_args(plugin["args"])
    assert args.kubelet_dir == dra_registration.DEFAULT_KUBELET_DIR
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: host[m["name"]] for m in plugin["volumeMounts"]}
    server = dra_registration.PluginServer(None, args.kubelet_dir)  # type: ignore[arg-type]
    for socket in (server.dra_socket, server.registration_socket):
        # Under a mount of the host's directory at the same path: the kubelet finds it there.
        (mount,) = [m for m in mounts if socket.is_relative_to(m)]
        assert mounts[mount] == mount, socket
    assert mounts[str(args.state_dir)] == str(args.state_dir)
    assert mounts[str(Path(args.cdi_spec).parent)] == "/var/run/cdi"
    for probe in ("readinessProbe", "livenessProbe"):
        assert plugin[probe]["exec"]["command"] == ["test", "-S", str(server.dra_socket)]
    assert "device-plugins" not in host


def test_the_dra_plugin_may_publish_its_slice_and_read_claims() -> None:
    granted, builtin = permissions(render(DRA), "sharegpu-node")
    base, _ = permissions(render(BASE), "sharegpu-node")
    assert builtin == set()
    assert granted - base == {
        *(
            ("cluster", "resource.k8s.io", "resourceslices", verb)
            for verb in ("list", "create", "update", "delete")
        ),
        ("cluster", "resource.k8s.io", "resourceclaims", "get"),
        *(
            ("cluster", "resource.k8s.io", "resourceclaims/status", verb)
            for verb in ("get", "patch", "update")
        ),
        # status.devices of its own driver only, from its own node (the API server checks it).
        *(
            ("cluster", "resource.k8s.io", "resourceclaims/driver", verb, DRIVER)
            for verb in ("associated-node:patch", "associated-node:update")
        ),
    }
