"""What an operator runs on a node: `top`, the `-o`/`--watch` views, `status`, `doctor` and
`support-bundle`.

Everything here reads the node the same way with or without the agent: through its client when
one answers on the runtime directory, else from the tenant files, the arbiter regions and NVML
directly (`sharegpu.report`, `sharegpu.devices`).
"""
