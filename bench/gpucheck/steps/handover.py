"""What a hand-over between exclusive holds costs on this GPU, by how the next holder is told
(issue 33; bench/handover.py, docs/design/arbitration.md "Turns"): two plain driver-API programs,
no sharegpu, take turns in a fixed order and tell each other after the holder's sync returned
("drained", the hand-over sharegpu makes today) or as it enters its sync, the next holder's
stream waiting on the GPU for the holder's interprocess event ("queued") or for a word of its own
memory that the holder's stream writes ("word": cuStreamWaitValue32 / cuStreamWriteValue32, the
gate a waiter owns) or through a relay stream of its own that waits for the event and writes
that word ("relay": the design chosen for sharegpu's hand-over; "relayctx": the relay in a
context of its own with its word in page-locked host memory, as the shim's plan has it, to see
what the second context costs), beside the same programs time-sliced by the GPU ("bare").
On a real GPU this measures whether a queued hand-over costs only the GPU's own switch, as it
does on the simulated GPU.
"""

from __future__ import annotations

from typing import Any

from gpucheck.context import StepContext

CASES = ((1, 100), (4, 500))  # bursts x kernel µs
SHARES = (50, 30)


def run(ctx: StepContext) -> None:
    import handover

    seconds = 1.0 if ctx.target.real else ctx.scale(1.0, 0.4)
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for share in SHARES:
        for burst, us in CASES:
            case = f"{share}/{100 - share} {burst} x {us} us"
            found[case] = {}
            for mode in handover.MODES:
                r = handover.run_case(ctx.target.env, mode, share=share, burst=burst, us=us, seconds=seconds)
                found[case][mode] = {
                    "card_pct": round(r.card, 1),
                    "split_pct": [round(x, 1) for x in r.split],
                }
            ctx.figure(case, found[case])
    even = [c for c in found if c.startswith("50/50")]
    ctx.check(
        "at 50/50 a queued hand-over (event or word) costs the card less than one told after the sync",
        all(
            found[c][queued]["card_pct"] > found[c]["drained"]["card_pct"]
            for c in even
            for queued in ("queued", "word", "relay", "relayctx")
        ),
        "; ".join(
            f"{c}: {found[c]['queued']['card_pct']} / {found[c]['word']['card_pct']} / "
            f"{found[c]['relay']['card_pct']} / {found[c]['relayctx']['card_pct']} vs "
            f"{found[c]['drained']['card_pct']}"
            for c in even
        ),
    )
    ctx.summary(
        ", ".join(
            f"{c}: bare {v['bare']['card_pct']} / drained {v['drained']['card_pct']} / "
            f"queued {v['queued']['card_pct']} / word {v['word']['card_pct']} / "
            f"relay {v['relay']['card_pct']} / relayctx {v['relayctx']['card_pct']}%"
            for c, v in found.items()
            if c.startswith("50/50")
        )
    )
