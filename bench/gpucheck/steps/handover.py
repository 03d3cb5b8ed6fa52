"""What a hand-over between exclusive holds costs on this GPU, by how the next holder is told
(issue 33; bench/handover.py, docs/design/arbitration.md "Turns", "Queued hand-overs"): two plain
driver-API programs, no sharegpu, take turns in a fixed order and tell each other after the
holder's sync returned ("drained", the hand-over sharegpu makes by default) or as it enters its
sync, the next holder's stream waiting on the GPU for the holder's interprocess event ("queued")
or for a word of a file both map and page-lock, which the holder's stream writes ("shared": what
sharegpu's `handoff: queued` does with the arbiter region's words, ABI 1.12), beside the same
programs time-sliced by the GPU ("bare"). On a real GPU this measures whether a queued hand-over
costs only the GPU's own switch, as it does on the simulated GPU. (bench/handover.py's other
modes, word and relays, were the designs before 1.12: it runs them, this step does not.)
"""

from __future__ import annotations

from typing import Any

from gpucheck.context import StepContext

CASES = ((1, 100), (4, 500))  # bursts x kernel µs
SHARES = (50, 30)
MODES = ("bare", "drained", "queued", "shared")


def run(ctx: StepContext) -> None:
    import handover

    seconds = 1.0 if ctx.target.real else ctx.scale(1.0, 0.4)
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for share in SHARES:
        for burst, us in CASES:
            case = f"{share}/{100 - share} {burst} x {us} us"
            found[case] = {}
            for mode in MODES:
                r = handover.run_case(ctx.target.env, mode, share=share, burst=burst, us=us, seconds=seconds)
                found[case][mode] = {
                    "card_pct": round(r.card, 1),
                    "split_pct": [round(x, 1) for x in r.split],
                }
            ctx.figure(case, found[case])
    even = [c for c in found if c.startswith("50/50")]
    ctx.check(
        "at 50/50 a queued hand-over (event or shared word) costs the card less than one told after the sync",
        all(
            found[c][queued]["card_pct"] > found[c]["drained"]["card_pct"]
            for c in even
            for queued in ("queued", "shared")
        ),
        "; ".join(
            f"{c}: {found[c]['queued']['card_pct']} / {found[c]['shared']['card_pct']} vs "
            f"{found[c]['drained']['card_pct']}"
            for c in even
        ),
    )
    ctx.summary(
        ", ".join(
            f"{c}: bare {v['bare']['card_pct']} / drained {v['drained']['card_pct']} / "
            f"queued {v['queued']['card_pct']} / shared {v['shared']['card_pct']}%"
            for c, v in found.items()
            if c.startswith("50/50")
        )
    )
