"""Plots of a localization: iteration time, device heat map, evidence chain (matplotlib Agg).

Kept apart from the library core so matplotlib is imported only when a plot is asked for.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from holmes_ml.localize.types import Verdict

logger = logging.getLogger(__name__)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(verdict: Verdict, iterations: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write ``iterations.png``, ``heatmap.png`` and ``evidence.png`` into ``out_dir``.

    Parameters
    ----------
    verdict:
        The localization result.
    iterations:
        Per ``(iteration, rank)`` table with ``start_ns, end_ns, comm_us`` (as in
        :class:`holmes_ml.pipeline.NodeSummary`).
    out_dir:
        Created if missing.

    Returns
    -------
    list of pathlib.Path
        The files written.
    """
    for col in ("iteration", "rank", "start_ns", "end_ns", "comm_us"):
        if col not in iterations.columns:
            raise ValueError(f"iterations: missing column {col!r}; expected the NodeSummary "
                             "iterations table")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    written = []

    span = iterations.groupby("iteration").agg(s=("start_ns", "min"), e=("end_ns", "max"))
    secs = (span["e"] - span["s"]) / 1e9
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot(secs.index, secs.to_numpy(), marker="o", ms=3, label="iteration time")
    irr = [i for i in verdict.irregular_iterations if i in secs.index]
    if irr:
        ax.scatter(irr, secs.loc[irr].to_numpy(), color="red", zorder=3, label="irregular")
    ax.set_xlabel("iteration")
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    written.append(out / "iterations.png")
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)

    heat = iterations.pivot_table(index="rank", columns="iteration", values="comm_us",
                                  aggfunc="sum")
    rel = heat / heat.median(axis=0)
    fig, ax = plt.subplots(figsize=(8, 4))
    im = ax.imshow(rel.to_numpy(dtype=float), aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_xlabel("iteration")
    ax.set_ylabel("rank")
    ax.set_title("communication time per rank / median rank")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    written.append(out / "heatmap.png")
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3))
    if verdict.candidates:
        top = verdict.candidates[0]
        ev = top.evidence
        labels = [f"it{e.iteration} {e.group}" + (f"#{e.seq}" if e.seq >= 0 else "")
                  + f"\n{e.rule}" for e in ev]
        ax.barh(np.arange(len(ev)), [e.weight / 1e3 for e in ev], color="tab:orange")
        ax.set_yticks(np.arange(len(ev)), labels, fontsize=7)
        ax.set_xlabel("explained time (ms)")
        ax.set_title(f"evidence for {top.device} (score {top.score:.2f})")
    else:
        ax.text(0.5, 0.5, "no device blamed", ha="center", va="center")
        ax.set_axis_off()
    fig.tight_layout()
    written.append(out / "evidence.png")
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)
    logger.info("wrote %d plots into %s", len(written), out)
    return written
