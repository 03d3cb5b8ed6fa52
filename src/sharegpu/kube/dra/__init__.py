"""sharegpu as a Kubernetes DRA driver (`resource.k8s.io/v1`, Kubernetes 1.34 and later): a GPU is
one device of the node's ResourceSlice that many claims share by consumable capacity (memory in
bytes, compute in percent), the default scheduler places the claims, and the kubelet plugin
turns each prepared claim into a tenant of the one tenant service.

- `slices`: the node's ResourceSlice, from its GPUs (pure);
- `publisher`: keeps that slice current in the API server;
- `claims`: what an allocated ResourceClaim asks of this node (pure);
- `checkpoint`: the prepared claims, on disk, so a restarted plugin neither loses nor doubles one;
- `prepare`: prepare and unprepare, through the tenant service;
- `service`, `registration`: the kubelet's gRPC APIs (the *.proto files here);
- `__main__`: `python -m sharegpu.kube.dra`.
"""
