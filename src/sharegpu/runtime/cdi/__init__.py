"""CDI: a vGPU as a Container Device Interface device (`sharegpu.io/vgpu=<name>`), the one
format Docker, Podman, containerd, CRI-O and the kubelet read.

- model.py     the spec file's fields, rules and lowest version (from the CDI specification)
- generate.py  sharegpu's spec for this node: what a container of a tenant gets
"""
