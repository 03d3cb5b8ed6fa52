"""The node component's inventory as written: the label value of a GPU model and the Node patch
(kube/publisher.py). Publishing and reaping through the API-server stand-in is
tests/e2e/test_kube_node.py.
"""

from __future__ import annotations

import json

from sharegpu.devices import Gpu
from sharegpu.kube.inventory import ANNOTATION_INVENTORY, Inventory
from sharegpu.kube.publisher import (
    LABEL_GPU_COUNT,
    LABEL_GPU_MODEL,
    inventory_gpus,
    label_value,
    node_patch,
)

NODE = "n1"
GIB = 1 << 30


# ---------------------------------------------------------------------------------------------
# the inventory: what is written


def gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", memory: int = 80 * GIB) -> Gpu:
    return Gpu(index, f"GPU-{index}0000000-0000-0000-0000-000000000000", name, memory, 0, 0)


def test_the_gpu_model_is_made_a_label_value() -> None:
    assert label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert label_value("Tesla V100-SXM2-16GB") == "Tesla-V100-SXM2-16GB"
    assert label_value("(GeForce) RTX 4090!") == "GeForce-RTX-4090"
    long = label_value("A" * 62 + " B")
    assert long == "A" * 62  # cut at 63, and a label value ends with a letter or digit
    assert len(label_value("x" * 100)) == 63
    assert label_value(" ?! ") == ""


def test_the_patch_carries_the_inventory_and_the_labels() -> None:
    gpus = [gpu(1), gpu(0)]
    inventory = Inventory(gpus=inventory_gpus(gpus), published_at=12.5)
    patch = node_patch(inventory)
    assert patch["metadata"]["labels"] == {LABEL_GPU_MODEL: "NVIDIA-H100-80GB-HBM3", LABEL_GPU_COUNT: "2"}
    written = json.loads(patch["metadata"]["annotations"][ANNOTATION_INVENTORY])
    assert written["published_at"] == 12.5
    assert [(g["index"], g["memory_mib"]) for g in written["gpus"]] == [(0, 80 * 1024), (1, 80 * 1024)]

    mixed = Inventory(gpus=inventory_gpus([gpu(0), gpu(1, "NVIDIA A100")]), published_at=1)
    assert node_patch(mixed)["metadata"]["labels"][LABEL_GPU_MODEL] == "NVIDIA-A100_NVIDIA-H100-80GB-HBM3"
    # No GPU: the model label is removed (null in a merge patch), the count says 0.
    assert node_patch(Inventory(gpus=(), published_at=1))["metadata"]["labels"] == {
        LABEL_GPU_MODEL: None,
        LABEL_GPU_COUNT: "0",
    }
