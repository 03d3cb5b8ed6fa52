"""sharegpu as a Kubernetes DRA driver (`resource.k8s.io/v1`, Kubernetes 1.34 and later): a GPU is
one device of the node's ResourceSlice that many claims share by consumable capacity (memory in
bytes, compute in percent), the default scheduler places the claims, and the kubelet plugin
turns each prepared claim into a tenant of the one tenant service.

- `slices`: the node's ResourceSlices, from its GPUs (pure): shared, or in partitions;
- `publisher`: keeps those slices current in the API server;
- `claims`: what an allocated ResourceClaim asks of this node (pure);
- `checkpoint`: the prepared claims, on disk, so a restarted plugin neither loses nor doubles one;
- `prepare`: prepare and unprepare, through the tenant service;
- `status`: what a prepared claim's tenant got, on the claim (`status.devices`);
- `service`, `registration`: the kubelet's gRPC APIs (the *.proto files here);
- `__main__`: `python -m sharegpu.kube.dra`.
"""
