"""Running workloads under sharegpu: `sharegpu run` on a host (CDI and OCI hooks come later)."""
