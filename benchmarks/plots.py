"""Plots of MaskBench results: the distribution of per-token mask time, one panel per engine.

    .venv/bin/python benchmarks/plots.py maskbench.json benchmarks/mask_time.png

Reads the file ``benchmarks/maskbench.py --json-out`` writes (``maskbench.py --plot PATH`` calls
:func:`plot_mask_times` on the same records directly). The times are TBM's: every mask computed while an engine
forces the valid instances of the schemas it compiled, in microseconds. Each panel is a histogram over
logarithmic bins on a shared logarithmic time axis, with the p50, p95 and p99 marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: The percentiles marked on each panel.
PERCENTILES = (50, 95, 99)
#: Bins per factor of ten on the time axis.
BINS_PER_DECADE = 20


def mask_times(run: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per engine, in the run's engine order, every timed mask of the run in microseconds."""
    engines = list(run["engines"])
    times: dict[str, list[float]] = {e: [] for e in engines}
    for schema in run["schemas"]:
        for engine, record in schema["engines"].items():
            if engine in times:
                times[engine].extend(record.get("tbm_us", ()))
    return {e: np.asarray(times[e], dtype=float) for e in engines}


def plot_mask_times(run: dict[str, Any] | str | Path, out: str | Path, *, title: str | None = None) -> Path:
    """Write a PNG of the per-token mask time of each engine of ``run`` (a ``--json-out`` record or its path)
    to ``out``, and return that path. Engines with no timed mask are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not isinstance(run, dict):
        run = json.loads(Path(run).read_text(encoding="utf-8"))
    times = {e: t[t > 0] for e, t in mask_times(run).items()}
    times = {e: t for e, t in times.items() if t.size}
    if not times:
        raise ValueError("the run holds no timed mask")
    versions = run.get("engines", {})

    low = min(float(t.min()) for t in times.values())
    high = max(float(t.max()) for t in times.values())
    decades = np.log10(high) - np.log10(low)
    bins = np.logspace(np.log10(low), np.log10(high), max(10, int(decades * BINS_PER_DECADE)) + 1)

    fig, axes = plt.subplots(len(times), 1, sharex=True, figsize=(9, 1.9 * len(times) + 1.0), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (ax, (engine, t)) in enumerate(zip(axes[:, 0], times.items())):
        colour = colours[i % len(colours)]
        weights = np.full(t.size, 100.0 / t.size)  # each bar: the share of the engine's masks, in %
        ax.hist(t, bins=bins, weights=weights, color=colour, alpha=0.75)
        ax.set_xscale("log")
        top = ax.get_ylim()[1]
        for k, (q, style) in enumerate(zip(PERCENTILES, ("-", "--", ":"))):
            v = float(np.percentile(t, q))
            ax.axvline(v, color="black", linestyle=style, linewidth=1)
            ax.text(
                v,
                top * (0.95 - 0.15 * k),
                f" p{q} {v:,.1f} µs",
                fontsize=8,
                va="top",
                ha="left",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
            )
        name = f"{engine} {versions.get(engine, '')}".strip()
        ax.set_ylabel("% of masks")
        ax.set_title(f"{name}: {t.size:,} masks", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time per mask (µs, log scale)")
    schemas = len(run.get("schemas", ()))
    fig.suptitle(title or f"MaskBench: time per mask, {schemas:,} schemas ({run.get('started', '')})", fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", type=Path, help="a maskbench.py --json-out file")
    p.add_argument("out", type=Path, help="the PNG to write")
    p.add_argument("--title", help="the figure's title")
    args = p.parse_args(argv)
    print(plot_mask_times(args.records, args.out, title=args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
