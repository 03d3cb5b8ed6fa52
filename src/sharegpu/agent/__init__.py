"""The node agent: tenant lifecycle, live resize, reconciliation, reaping, audit, QoS, hot upgrade.

The data plane (the shim and the regions under the runtime directory) never depends on the
agent: tenants keep running, and stay enforced, while it is stopped, restarted or upgraded.
"""
