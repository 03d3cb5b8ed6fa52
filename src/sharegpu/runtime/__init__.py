"""Running workloads under sharegpu: `sharegpu run` on a host (run.py) and the CDI spec and
container hooks (cdi/). Every tenant they make goes through sharegpu.doors.tenant_service()."""
