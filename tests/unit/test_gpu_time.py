"""GPU time's pure parts: the charges' rate between two readings, and the cross-check's verdicts
(the loop that applies them runs against the simulated GPU in test_accounting.py)."""

from __future__ import annotations

from sharegpu.agent.busy import (
    UNCHARGED_RATIO,
    UNCHARGED_SECONDS,
    Crosscheck,
    charges_at,
    crosscheck,
    uncharged_suspect,
)
from sharegpu.report import charge_rates

A = ("a", 1, "GPU-0")
B = ("b", 1, "GPU-0")
B2 = ("b", 2, "GPU-0")


def test_the_charges_rate_is_what_was_charged_between_two_readings() -> None:
    before = {A: 1_000_000_000, B: 5_000_000_000}
    after = {A: 1_300_000_000, B: 5_700_000_000}
    assert charge_rates(before, after, 1.0) == {A: 0.3, B: 0.7}
    assert charge_rates(before, after, 2.0) == {A: 0.15, B: 0.35}


def test_a_new_tenant_counts_what_it_was_charged_since_the_first_reading() -> None:
    # Its entry is made at its first launch, after the first reading: all it has is new.
    assert charge_rates({A: 0}, {A: 0, B2: 250_000_000}, 1.0) == {A: 0.0, B2: 0.25}


def test_a_charge_that_went_back_counts_what_the_new_region_charged() -> None:
    # The GPU's region was rebuilt between the readings: its counters started again from zero.
    assert charge_rates({A: 9_000_000_000}, {A: 400_000_000}, 1.0) == {A: 0.4}


def test_the_rate_is_never_more_than_the_card_nor_measured_over_no_time() -> None:
    assert charge_rates({A: 0}, {A: 3_000_000_000}, 1.0) == {A: 1.0}
    assert charge_rates({A: 0}, {A: 1}, 0.0) == {}


def _run(pairs: list[tuple[float, float]]) -> list[str | None]:
    """One tenant alone on its GPU, second after second: (NVML's share, its charges' rate)."""
    state, verdicts = Crosscheck(), []
    for nvml, charged in pairs:
        suspect = uncharged_suspect(nvml, {A: (nvml, charged)})  # the card: its one tenant
        state, verdict = crosscheck(state, suspect == A)
        verdicts.append(verdict)
    return verdicts


def test_a_tenant_that_runs_past_its_charges_second_after_second_is_reported_once() -> None:
    past = (0.6, 0.0)
    verdicts = _run([past] * (UNCHARGED_SECONDS + 3))
    assert verdicts.index("started") == UNCHARGED_SECONDS - 1
    assert verdicts.count("started") == 1
    assert _run([past] * UNCHARGED_SECONDS + [(0.6, 0.59)])[-1] == "cleared"


def test_seconds_of_noise_between_nvml_and_the_charges_report_nothing() -> None:
    # NVML's samples and the quantum's edges move a few points from one second to the next; a
    # run shorter than UNCHARGED_SECONDS starts again from zero.
    just_past = (0.5 + UNCHARGED_RATIO + 0.01, 0.5)
    noisy = [just_past] * (UNCHARGED_SECONDS - 1) + [(0.52, 0.5)]
    assert _run(noisy * 4) == [None] * (UNCHARGED_SECONDS * 4)
    assert _run([(0.5 + UNCHARGED_RATIO, 0.5)] * 10) == [None] * 10  # at the margin: not past it
    assert _run([(0.0, 0.7)] * 10) == [None] * 10  # charged more than NVML saw: not this check's


def test_overlapping_per_process_figures_of_a_real_gpu_accuse_nobody() -> None:
    # An H200 under sharegpu (make gpu-check, shares-probe): the tenants' work got 29.3/68.6 and
    # 9.8/89.3 of the card, NVML's per-process figures said 49/60 and 40/81 (scaled to the card,
    # as busy_by_tenant does), the card ran 98%.
    for nvml, charged in (((0.49, 0.60), (0.293, 0.686)), ((0.40, 0.81), (0.098, 0.893))):
        scale = min(1.0, 1 / sum(nvml))
        tenants = {A: (nvml[0] * scale, charged[0]), B: (nvml[1] * scale, charged[1])}
        assert uncharged_suspect(0.98, tenants) is None
        assert uncharged_suspect(None, tenants) == A  # without the card's figure it would accuse


def test_the_tenant_whose_work_no_charge_accounts_for_is_the_suspect() -> None:
    # It zeroes its charges (test_accounting.py does it for real): the card ran 99%, the
    # tenants account for the honest one's half.
    tenants = {A: (0.49, 0.0), B: (0.50, 0.50)}
    assert uncharged_suspect(0.99, tenants) == A
    # A native tenant's GPU time is NVML's: it accounts for the card's time, and is never accused.
    native = ("n", 1, "GPU-0")
    assert uncharged_suspect(0.99, {B: (0.45, 0.45), native: (0.54, None)}) is None
    assert uncharged_suspect(0.99, {native: (0.99, None)}) is None


def test_the_charge_a_second_ago_is_read_between_the_ticks_around_it() -> None:
    readings = [(10.0, {A: 1_000_000_000}), (11.0, {A: 1_300_000_000, B: 200_000_000})]
    assert charges_at(readings, 10.25) == (10.25, {A: 1_075_000_000, B: 50_000_000})
    assert charges_at(readings, 9.0) == (10.0, {A: 1_000_000_000})  # before the first: it
    assert charges_at(readings, 12.0) == (11.0, {A: 1_300_000_000, B: 200_000_000})  # after: the last
    rebuilt = [(10.0, {A: 9_000_000_000}), (11.0, {A: 100_000_000})]
    assert charges_at(rebuilt, 10.5) == (10.5, {A: 9_000_000_000})
