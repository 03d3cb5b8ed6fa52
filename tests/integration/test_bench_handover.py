"""bench/handover.py on the simulated GPU: two programs that take turns themselves, told after the
holder's sync or queued on the GPU behind the holder's interprocess event or behind a word that the
holder's stream writes (in its own memory, or in a file both map: `shared`, sharegpu's since ABI
1.12)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
try:
    from _node import simulated_node
    from handover import MODES, run_case
finally:
    sys.path.pop(0)


@pytest.mark.timing
def test_a_queued_hand_over_costs_the_card_less_than_one_made_after_the_sync(built: Path) -> None:
    with simulated_node() as node:
        res = {mode: run_case(node.base_env, mode, share=50, burst=1, us=500, seconds=0.6) for mode in MODES}
    print({mode: (round(r.card, 1), [round(x, 1) for x in r.split]) for mode, r in res.items()})
    for mode in (
        "drained",
        "queued",
        "word",
        "relay",
        "relayctx",
        "shared",
    ):  # turns in a fixed order: the split is the order's
        assert abs(res[mode].split[0] - res[mode].split[1]) < 1
    # Told after its sync, the next holder's wake-up and launch leave the card idle at every turn
    # (87% on a quiet host); queued behind the holder's event or word, it pays the GPU's switch
    # only, as the programs do without turns (97.5% and 98.0%).  Runs of 0.6 s on a loaded 2-core
    # VM: a queued mode came 3.7 points under bare three times in a row in a CI run (94.1 against
    # 97.8, drained 85-87), so the margin to bare is 5 points, still well above the drained mode.
    for queued in ("queued", "word", "relay", "relayctx", "shared"):
        assert res[queued].card > res["drained"].card + 4, queued
        assert res[queued].card > res["bare"].card - 5, queued
