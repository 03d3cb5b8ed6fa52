"""wgpu (WebGPU over Vulkan) as an unmodified application would use it: the adapter, then storage
buffers of N MiB until the device refuses one (at most COUNT).

    python wgpu_buffers.py N [COUNT]

Prints key=value lines: adapter, backend, max_buffer_size (the device's limit), buffers (how many
were made), error (the first line of wgpu's error, or none).
"""

from __future__ import annotations

import sys

import wgpu


def main() -> None:
    mib, count = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print(f"adapter={adapter.info['device'].replace(' ', '_')}")
    print(f"backend={adapter.info['backend_type']}")
    device = adapter.request_device_sync()
    print(f"max_buffer_size={device.limits['max-buffer-size']}")
    buffers, error = [], "none"
    for _ in range(count):
        try:
            buffers.append(device.create_buffer(size=mib << 20, usage=wgpu.BufferUsage.STORAGE))
        except Exception as err:  # wgpu raises its GPU errors as exceptions here
            error = f"{type(err).__name__}:{str(err).splitlines()[-1].strip().replace(' ', '_')}"
            break
    print(f"buffers={len(buffers)}")
    print(f"error={error}")


if __name__ == "__main__":
    main()
