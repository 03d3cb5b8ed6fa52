"""Allocation ratio against arrived demand, one curve per policy (needs the ``plot`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sharegpu.errors import ConfigError
from sharegpu.sim.engine import SimResult


def plot_allocation(results: Sequence[SimResult], out: Path, title: str = "") -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'sharegpu[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        xs = [p.demand * 100 for p in r.points]
        ys = [p.allocation_ratio * 100 for p in r.points]
        ax.plot(xs, ys, label=f"{r.policy} ({r.at(1.0).allocation_ratio * 100:.2f}% at 100%)")
    ax.plot([0, 100], [0, 100], color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_title(title or "GPU allocation ratio vs arrived demand")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except OSError as err:
        raise ConfigError(f"{out}: cannot write the plot: {err.strerror}") from err
    finally:
        plt.close(fig)
    return out
