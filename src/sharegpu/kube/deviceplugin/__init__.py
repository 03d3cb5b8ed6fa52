"""The kubelet device plugin for `sharegpu.io/vgpu` (docs/kubernetes-device-plugin.md).

- api.proto: the kubelet's device plugin API v1beta1; api_pb2*.py are generated (`make proto`);
- slots.py: the devices advertised (`<GPU uuid>::<n>`, SLOTS_PER_GPU per GPU) and their health;
- pods.py: where the pods bound to this node come from (PodSource: the API server, or a file);
- matching.py: which pod and container an `Allocate` is for (kube/assignment.py);
- allocate.py: the tenant made for a container (through sharegpu.doors' tenant service), and
  what the kubelet hands its runtime;
- podwatch.py: the tenants of pods that are gone removed through the same service (a watch of
  the node's pods);
- service.py: the DevicePlugin gRPC service; registration.py: serving it and registering with
  the kubelet, again whenever the kubelet restarts; __main__.py: the command (with the pod
  reaper and the inventory publisher, kube/publisher.py, as threads).
"""
