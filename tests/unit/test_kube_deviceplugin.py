"""The kubelet device plugin's pieces that need no kubelet: tenant names, and the API-server pod
source on a stand-in of the client's two calls. The plugin driven by a fake kubelet over gRPC is
tests/e2e/test_kube_deviceplugin.py.
"""

from __future__ import annotations

from typing import Any

from sharegpu.kube.deviceplugin.allocate import tenant_name
from sharegpu.kube.request import ANNOTATION_ALLOCATED

NODE = "n1"


# ---------------------------------------------------------------------------------------------
# pods and the plugin process


def test_tenant_names_keep_to_the_tenant_id_rules() -> None:
    assert tenant_name("ABCDEF12-3456", "Web_Server") == "pod-abcdef12-web_server"
    long = tenant_name("abcdef12-3456", "c" * 63)
    assert len(long) == 63
    assert long.startswith("pod-abcdef12-ccc")
    assert long != tenant_name("abcdef12-3456", "c" * 62 + "d")


def test_the_api_server_source_lists_the_nodes_pending_pods_and_patches_the_annotation() -> None:
    from kubernetes import client

    from sharegpu.kube.deviceplugin.pods import KubePodSource

    calls: list[tuple[str, Any]] = []

    class Api:
        def list_pod_for_all_namespaces(self, field_selector: str) -> Any:
            calls.append(("list", field_selector))
            meta = client.V1ObjectMeta(name="web-0", namespace="ml", uid="u1", annotations={"a": "b"})
            return client.V1PodList(items=[client.V1Pod(metadata=meta)])

        def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> None:
            calls.append(("patch", (name, namespace, body)))

    source = KubePodSource.__new__(KubePodSource)  # no cluster here: the client's calls only
    source._api = Api()  # type: ignore[assignment]
    source._client = client.ApiClient()
    (found,) = source.pending_pods(NODE)
    assert found["metadata"] == {"name": "web-0", "namespace": "ml", "uid": "u1", "annotations": {"a": "b"}}
    found["metadata"]["annotations"][ANNOTATION_ALLOCATED] = "init"
    source.mark_allocated(found, "main")
    assert calls == [
        ("list", f"spec.nodeName={NODE},status.phase=Pending"),
        ("patch", ("web-0", "ml", {"metadata": {"annotations": {ANNOTATION_ALLOCATED: "init,main"}}})),
    ]
