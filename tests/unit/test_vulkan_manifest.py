"""Which Vulkan layer `sharegpu run` and the CDI spec enable: none when it was not built, the
package's when its manifest is sound, and a clear error when the loader would skip it (a program
would then allocate unmetered without a word)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharegpu.errors import ConfigError
from sharegpu.native import VK_LAYER_NAME, vulkan_layer_share


def lib_dir(tmp_path: Path, manifest: object | None, *, library: bool = True) -> Path:
    if library:
        (tmp_path / "libsharegpu_vk.so").write_bytes(b"\x7fELF")
    if manifest is not None:
        where = tmp_path / "share" / "vulkan" / "implicit_layer.d"
        where.mkdir(parents=True)
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (where / "sharegpu_vk.json").write_text(text)
    return tmp_path


def sound(name: str = VK_LAYER_NAME, path: str = "../../../libsharegpu_vk.so") -> dict[str, object]:
    return {"file_format_version": "1.2.0", "layer": {"name": name, "library_path": path}}


def test_not_built_is_none(tmp_path: Path) -> None:
    assert vulkan_layer_share(lib_dir(tmp_path, None, library=False)) is None


def test_a_sound_manifest_gives_its_data_directory(tmp_path: Path) -> None:
    assert vulkan_layer_share(lib_dir(tmp_path, sound())) == tmp_path / "share"


@pytest.mark.parametrize(
    ("manifest", "library", "says"),
    [
        ("{not json", True, "unusable"),
        ({"file_format_version": "1.2.0"}, True, "unusable"),
        (sound(name="VK_LAYER_other"), True, "VK_LAYER_other"),
        (sound(path="../../../elsewhere.so"), True, "missing"),
        (None, True, "unusable"),  # the library without its manifest
        (sound(), False, "missing"),  # the manifest without its library
    ],
)
def test_a_manifest_the_loader_would_skip_is_an_error(
    tmp_path: Path, manifest: object | None, library: bool, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        vulkan_layer_share(lib_dir(tmp_path, manifest, library=library))
