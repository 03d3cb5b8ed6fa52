"""Kubernetes: what pods ask for (request), the device plugin and the scheduler extender.

Above the runtime layer: a vGPU made for a pod is a tenant made through the one tenant service
(sharegpu.runtime.tenants) and handed to the container as a CDI device (sharegpu.runtime.cdi).
"""
