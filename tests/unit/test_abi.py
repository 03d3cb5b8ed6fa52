"""The Python mirror (abi.py): a GPU UUID to its 16 bytes and back. The comparison with the C
header, compiled, is tests/integration/test_abi.py.
"""

from __future__ import annotations

import pytest

from sharegpu.regions import abi


@pytest.mark.parametrize(
    "text",
    [pytest.param("GPU-5a1e0000-0000-4000-8000-000000000001", id="nvml-form")],
)
def test_uuid_round_trip(text: str) -> None:
    raw = abi.uuid_to_bytes(text)
    assert len(raw) == 16
    assert abi.bytes_to_uuid(raw) == text
