"""Bench output: percentiles, Markdown tables and PNG plots (matplotlib, the ``bench`` extra)."""

from __future__ import annotations

import math
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """``percentile_cont`` of sorted ``values`` (may end in ``inf``); ``nan`` if empty."""
    if not values:
        return math.nan
    pos = q * (len(values) - 1)
    lo = math.floor(pos)
    frac = pos - lo
    if frac == 0 or lo + 1 >= len(values):
        return values[lo]
    hi = values[lo + 1]
    if math.isinf(hi):
        return math.inf
    return values[lo] + (hi - values[lo]) * frac


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    """A GitHub Markdown table of ``rows`` restricted to ``columns``."""

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def plot_lag(series: list[dict], path: Path, title: str) -> Path | None:
    """Plot runs fired per 100 ms and max lateness over time, big vs small tenants.

    ``series`` rows: ``bucket`` (100 ms since the nominal instant), ``big``,
    ``runs``, ``lag_max_s``. Returns the PNG path, or None without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for big, label in ((True, "big tenant"), (False, "small tenants")):
        pts = [r for r in series if r["big"] == big]
        xs = [r["bucket"] / 10 for r in pts]
        top.plot(xs, [r["runs"] * 10 for r in pts], label=label)
        bottom.plot(xs, [r["lag_max_s"] for r in pts], label=label)
    top.set_ylabel("runs/s (100 ms buckets)")
    bottom.set_ylabel("max lateness (s)")
    bottom.set_xlabel("seconds after the nominal instant (fired_at)")
    top.legend()
    top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
