"""The arbiter settings an operator gives the agent (sharegpu.agent.tuning), in process: every
figure of the region reaches the views, the settings are the arbiter's table, times are
nanoseconds or durations. With a real agent and real work: tests/integration/test_agent_tuning.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from arbiterutil import FIGURES
from sharegpu.agent.models import ArbiterView
from sharegpu.agent.tuning import ArbiterTuning
from sharegpu.arbiter import (
    TUNABLES,
    ArbiterStatus,
)
from sharegpu.regions import abi

# What the region holds and the views leave out: the token's state, the prediction's working
# figures, the header and the tables (shown as `holder_pid`, `waiting` and the tenants' views).
INTERNAL = {
    "hdr",
    "lock",
    "uuid",
    "tenant_slots",
    "client_slots",
    "token",
    "quantum_end_ns",
    "grant_ns",
    "online_active_until_ns",
    "last_release_ns",
    "online_last_arrival_ns",
    "online_outliers",
    "online_cand_period_ns",
    "online_cand_last_ns",
    "online_cand_samples",
    "offline_hold_until_ns",
    "misses_in_row",
    "offline_quiet_until_ns",
    "pad0",
    "pad1",
    "pad2",
    "pad3",
    "pad4",
    "queued_by",
    "queued_seq",
    "online_last_end_ns",
    "online_gap_jitter_ns",
    "reserved",
    "tenants",
    "clients",
}


def test_every_figure_of_the_region_reaches_the_views() -> None:
    """A field added to the region (abi.Arbiter) must be read (ArbiterStatus) and shown
    (ArbiterView: GET /v1/gpus, `sharegpu devices -o json`), or be named internal above."""
    region = {name for name, _ in abi.Arbiter._fields_}
    read = {f.name for f in dataclasses.fields(ArbiterStatus)}
    assert region - INTERNAL <= read, region - INTERNAL - read
    assert set(FIGURES) | set(TUNABLES) == region - INTERNAL
    shown = set(ArbiterView.model_fields)
    assert read - {"path", "uuid", "tenants", "clients"} <= shown, read - shown


def test_the_settings_are_the_tables_but_the_qos_loops_bound() -> None:
    """A tunable added to sharegpu.arbiter.TUNABLES is one an operator can set, unless the QoS
    loop owns it (offline_inflight_max)."""
    assert set(ArbiterTuning.model_fields) == set(TUNABLES) - {"offline_inflight_max"}
    for name in ArbiterTuning.model_fields:  # each checked by its entry (the same one-line errors)
        with pytest.raises(ValueError, match=f"invalid {TUNABLES[name].what} "):
            ArbiterTuning.model_validate({name: "by-nothing" if TUNABLES[name].codes else 10**12})


@pytest.mark.parametrize(
    ("given", "ns"),
    [
        pytest.param(5_000_000, 5_000_000, id="int"),
        pytest.param("5ms", 5_000_000, id="ms"),
        pytest.param("0.5ms", 500_000, id="decimal"),
        pytest.param("300us", 300_000, id="us"),
        pytest.param("1s", 1_000_000_000, id="s"),
        pytest.param("250", 250, id="string-ns"),
        pytest.param(0, 0, id="off"),
    ],
)
def test_times_are_nanoseconds_or_durations(given: object, ns: int) -> None:
    assert ArbiterTuning.model_validate({"offline_quiet_ns": given}).offline_quiet_ns == ns
