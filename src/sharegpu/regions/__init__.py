"""The shared regions: the one home of every rule about the memory sharegpu's processes share.

- ``abi``: the ctypes mirror of ``native/include/sharegpu/abi.h`` (checked against the C
  layout by ``tests/integration/test_abi.py``).
- ``files``: a region's header (written and checked), publishing a region whole by rename,
  and the robust process-shared mutex a region holds.
- ``mapping``: cached read-only mappings, for readers that look many times a second.
- ``liveness``: whether the process an entry names still lives, and its pid on the host.
- ``agentlib``: the rules that are C's (taking a region's robust mutex and changing what the
  shims change under it, the liveness test, the arbiter region's validation), called in
  ``libsgagent.so``, which is compiled from the shim's own files: never a Python copy of them.

The tenant's regions (``sharegpu.tenant.regions``) and the GPU arbiter's
(``sharegpu.arbiter``) stand on these; nothing here imports from above.
"""
