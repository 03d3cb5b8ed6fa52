"""Kubernetes: what pods ask for, the node component and the scheduler extender.

- request.py: a pod's vGPU resources and annotations; assignment.py: the decision written on it
  at bind; inventory.py: a node's GPUs as its Node object carries them;
- apiclient.py: the one way to reach the API server; events.py: Warning events on pods;
- extender/: the kube-scheduler extender (placement, binding, its state kept in step with the
  API server); bindings.py: binding through the API server without oversubscribing a GPU;
  leader.py: leader election on a Lease;
- deviceplugin/: the node component (the kubelet device plugin, the pod reaper);
  publisher.py: the node's inventory on its Node object.

Above the runtime layer: a vGPU made for a pod is a tenant made through the one tenant service
(sharegpu.doors.tenant_service) and handed to the container as a CDI device (sharegpu.runtime.cdi).
"""
