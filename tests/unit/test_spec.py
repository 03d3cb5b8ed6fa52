"""Parsing sizes, shares, GPU selectors and tenant names: good input in, one clear error out."""

from __future__ import annotations

import pytest

from sharegpu.errors import SpecError
from sharegpu.spec import (
    GIB,
    MIB,
    ComputeSpec,
    GpuSelector,
    format_size,
    parse_memory_cap,
    parse_percent,
    parse_size,
    tenant_id_from,
    validate_tenant_id,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("512MiB", 512 * MIB, id="mib"),
        pytest.param("4GiB", 4 * GIB, id="gib"),
        pytest.param("1.5GiB", 1536 * MIB, id="fractional"),
        pytest.param("4G", 4 * GIB, id="docker-style-binary"),
        pytest.param(" 2 gib ", 2 * GIB, id="spaces-and-case"),
        pytest.param("1TiB", 1 << 40, id="tib"),
        pytest.param("1000MB", 1000 * 1000 * 1000, id="decimal"),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "expected a number and a unit", id="empty"),
        pytest.param("abc", "expected a number and a unit", id="words"),
        pytest.param("4096", "add a unit", id="no-unit"),
        pytest.param("4XB", "unknown unit", id="unknown-unit"),
        pytest.param("-1GiB", "expected a number", id="negative"),
        pytest.param("1e3MiB", "expected a number", id="exponent"),
        pytest.param("9" * 400 + "GiB", "too large", id="huge"),
        pytest.param("8388608TiB", "too large", id="past-64-bits"),
        pytest.param("0.1GiB", "not a whole number of bytes", id="fraction-of-a-byte"),
    ],
)
def test_bad_sizes(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("0MiB", "at least 1MiB", id="zero"),
        pytest.param("0.5MiB", "whole number of MiB", id="half-mib"),
        pytest.param("1000KB", "whole number of MiB", id="not-mib-aligned"),
        pytest.param("1.1GiB", "whole number", id="fraction-of-mib"),
    ],
)
def test_bad_memory_caps(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_memory_cap(text)


def test_cap_is_exact() -> None:
    assert parse_memory_cap("1.5GiB") == 1536 * MIB


@pytest.mark.parametrize(
    ("text", "permille"),
    [
        pytest.param("30%", 300, id="pct"),
        pytest.param("1", 10, id="bare-1"),
        pytest.param("100%", 1000, id="full"),
    ],
)
def test_percent(text: str, permille: int) -> None:
    assert parse_percent(text) == permille


@pytest.mark.parametrize("text", ["0%", "101%", "12.5%", "-5%", "abc", ""])
def test_bad_percent(text: str) -> None:
    with pytest.raises(SpecError):
        parse_percent(text)


def test_gpu_selector() -> None:
    assert GpuSelector.parse("1") == GpuSelector(index=1)
    assert GpuSelector.parse("GPU-ABCD1234").uuid == "GPU-abcd1234"
    with pytest.raises(SpecError, match="give an index"):
        GpuSelector.parse("first")


@pytest.mark.parametrize("name", ["UPPER", "-lead", "a" * 64, "has space", "", "x/y"])
def test_bad_tenant_names(name: str) -> None:
    with pytest.raises(SpecError):
        validate_tenant_id(name)


def test_format_size() -> None:
    assert format_size(4 * GIB) == "4GiB"
    assert format_size(1536 * MIB) == "1.5GiB"
    assert format_size(512 * MIB) == "512MiB"
    assert format_size(10) == "10B"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, ComputeSpec("share", "normal", 1000, 1000, 1), id="defaults"),
        pytest.param({"compute": "30%"}, ComputeSpec("share", "normal", 300, 300, 1), id="share"),
        pytest.param(
            {"compute": "20%", "policy": "cap"}, ComputeSpec("cap", "normal", 200, 200, 1), id="cap"
        ),
        pytest.param(
            {"compute": "20%", "policy": "burst", "ceiling": "60%"},
            ComputeSpec("burst", "normal", 200, 600, 1),
            id="burst",
        ),
        pytest.param(
            {"compute": "20", "policy": "burst"},
            ComputeSpec("burst", "normal", 200, 1000, 1),
            id="burst-default-ceiling",
        ),
        pytest.param(
            {"policy": "native", "priority": "offline"},
            ComputeSpec("native", "offline", 1000, 1000, 1),
            id="native",
        ),
        pytest.param(
            {"priority": "ONLINE", "weight": 3},
            ComputeSpec("share", "online", 1000, 1000, 3),
            id="online-weighted",
        ),
    ],
)
def test_compute_spec(kwargs: dict[str, object], expected: ComputeSpec) -> None:
    assert ComputeSpec.parse(**kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"compute": "0%"}, "between 1% and 100%", id="zero"),
        pytest.param({"compute": "101%"}, "between 1% and 100%", id="over-100"),
        pytest.param({"policy": "fair"}, "invalid policy", id="unknown-policy"),
        pytest.param({"priority": "urgent"}, "invalid priority", id="unknown-priority"),
        pytest.param({"weight": 0}, "invalid weight", id="zero-weight"),
        pytest.param(
            {"compute": "30%", "policy": "burst", "ceiling": "20%"}, "below the guarantee", id="ceiling-below"
        ),
        pytest.param({"compute": "30%", "ceiling": "50%"}, "burst only", id="ceiling-without-burst"),
        pytest.param({"policy": "native", "compute": "30%"}, "no compute control", id="native-with-share"),
    ],
)
def test_bad_compute_spec(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        ComputeSpec.parse(**kwargs)  # type: ignore[arg-type]


def test_guarantees() -> None:
    assert ComputeSpec.parse("30%", "cap").guarantee_permille == 300
    assert ComputeSpec.parse("30%", "burst", "50%").guarantee_permille == 300
    assert ComputeSpec.parse("30%").guarantee_permille == 0


def test_tenant_ids_made_from_outside_names_keep_the_rules() -> None:
    # The CDI hook (container ids) and the device plugin (pod uid + container) both use it.
    assert tenant_id_from("ctr-ABC:def/12") == "ctr-abc-def-12"
    long = tenant_id_from("pod-" + "x" * 100)
    assert len(long) == 63
    assert long != tenant_id_from("pod-" + "x" * 99 + "y")  # the digest keeps them apart
    with pytest.raises(SpecError, match="invalid tenant name"):
        tenant_id_from("-starts-with-a-dash")
