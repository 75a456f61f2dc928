"""Plots of a localization: iteration time, device heat map, evidence chain and the slow
communicators around the suspects (matplotlib Agg).

Kept apart from the library core so matplotlib is imported only when a plot is asked for.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from holmes_ml.features.iterations import IrregularityConfig
from holmes_ml.localize.rules import step_compute
from holmes_ml.localize.types import Verdict

if TYPE_CHECKING:
    import networkx as nx

logger = logging.getLogger(__name__)

#: The files :func:`write_plots` may write into its directory.
PLOT_NAMES: tuple[str, ...] = ("iterations.png", "heatmap.png", "evidence.png", "compute.png",
                               "graph.png")
#: graph.png: at most this many suspects, and this many communicators around them
_GRAPH_SUSPECTS = 3
_GRAPH_COMMS = 12
#: heatmap.png: at most this many rows (more ranks share rows), suspects marked
_HEAT_ROWS = 256
_HEAT_MARKS = 3
#: heatmap.png: suspects behind at most this many ranks are marked (a link or leaf switch too)
_HEAT_MARK_RANKS = 16
#: heatmap.png: the colour scale reaches at least this far (x / median rank): a few per cent of
#: jitter between ranks stays pale
_HEAT_FLOOR = 1.25
_KIND_COLOURS = {"communicator": "tab:blue", "gpu": "tab:green", "nic": "tab:purple",
                 "link": "tab:brown", "switch": "tab:gray", "host": "tab:olive"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(verdict: Verdict, iterations: pd.DataFrame, out_dir: str | Path,
                graph: nx.Graph | None = None, delta: float = IrregularityConfig.delta
                ) -> list[Path]:
    """Write ``iterations.png``, ``heatmap.png`` and ``evidence.png`` into ``out_dir``,
    ``graph.png`` when ``graph`` is given, and ``compute.png`` when ``iterations`` carries each
    rank's compute time per step (``compute_us``) or the verdict names a heavier stage from the
    time outside communication (a workload finding with ``basis`` ``"gaps"``; the map then
    shows that time).

    Parameters
    ----------
    verdict:
        The localization result.
    iterations:
        Per ``(iteration, rank)`` table with ``start_ns, end_ns, comm_us`` (as in
        :class:`holmes_ml.pipeline.NodeSummary`).
    out_dir:
        Created if missing.
    graph:
        The verdict's operator-device graph
        (:func:`holmes_ml.localize.graph.evidence_graph`): ``graph.png`` draws the first
        suspects and the communicators with abnormal copies that touch them, the most abnormal
        copies first.
    delta:
        The irregularity threshold the verdict was found with: ``iterations.png`` draws
        ``delta`` times the monitor's reference, the line an iteration must cross to be irregular.

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

    written.append(out / "iterations.png")
    _draw_iterations(plt, verdict, iterations, delta, written[-1])

    written.append(out / "heatmap.png")
    _draw_heatmap(plt, verdict, iterations, written[-1])

    fig, ax = plt.subplots(figsize=(9, 3.4))
    if verdict.candidates:
        top = verdict.candidates[0]
        ev = top.evidence
        ax.barh(np.arange(len(ev)), [e.weight / 1e3 for e in ev], color="tab:orange")
        ax.set_yticks(np.arange(len(ev)), evidence_labels(ev), fontsize=6)
        ax.invert_yaxis()  # the heaviest on top, as listed
        ax.set_xlabel("explained time (ms)")
        ax.set_title(f"evidence for {top.device} (score {top.score:.2f})")
    else:
        said = ["no device blamed"] + [f"workload ({w.kind}): {w.detail}"
                                       for w in verdict.workload_findings]
        ax.text(0.5, 0.5, "\n\n".join(textwrap.fill(t, 90) for t in said), ha="center",
                va="center", fontsize=8)
        ax.set_axis_off()
    fig.tight_layout()
    written.append(out / "evidence.png")
    fig.savefig(written[-1], dpi=90, bbox_inches="tight")  # long labels stay whole
    plt.close(fig)
    logged = "compute_us" in iterations.columns and iterations["compute_us"].notna().any()
    if logged or any(w.basis == "gaps" for w in verdict.workload_findings):
        read = step_compute(iterations)
        if read is not None:
            written.append(out / "compute.png")
            _draw_compute(plt, verdict, *read, written[-1])
    if graph is not None:
        written.append(out / "graph.png")
        _draw_graph(plt, graph, written[-1])
    logger.info("wrote %d plots into %s", len(written), out)
    return written


def iteration_line(iterations: pd.DataFrame, delta: float = IrregularityConfig.delta
                   ) -> pd.DataFrame:
    """``iterations.png``'s data: per logged iteration (the index), ``seconds`` as the
    irregularity monitor times it (end to end where operators end each step), ``threshold``
    (``delta`` times the monitor's reference, in seconds; NaN over its warm-up, which flags
    nothing) and ``x``, its place on the axis:
    logged iterations side by side, a gap in the numbering one step wide (traces that log a few
    stretches of a long run stay readable) and marked by ``gap_before``."""
    from holmes_ml.pipeline import iteration_monitor

    monitor, end_to_end = iteration_monitor(iterations, delta)
    its = monitor.index.to_numpy(dtype=np.int64)
    gap = np.r_[False, np.diff(its) > 1]
    out = pd.DataFrame({"seconds": monitor["duration_s"].to_numpy(),
                        # the monitor's warm-up flags nothing (its reference is provisional):
                        # no line there, which read as "irregular above"
                        "threshold": np.where(
                            np.arange(len(its)) >= IrregularityConfig().min_history,
                            delta * monitor["reference_s"].to_numpy(), np.nan),
                        "x": np.arange(len(its)) + np.cumsum(gap), "gap_before": gap},
                       index=monitor.index)
    out.attrs["end_to_end"] = end_to_end
    return out


def _draw_iterations(plt, verdict: Verdict, iterations: pd.DataFrame, delta: float,
                     path: Path) -> None:
    """Iteration time, the irregular ones in red, and the line they crossed."""
    line = iteration_line(iterations, delta)
    fig, ax = plt.subplots(figsize=(8, 3))
    x = line["x"].to_numpy(dtype=float)
    y = line["seconds"].to_numpy(dtype=float)
    thr = line["threshold"].to_numpy(dtype=float)
    # a gap in the logged iterations breaks the line instead of joining across it
    cut = np.flatnonzero(line["gap_before"].to_numpy())
    judged = bool(np.isfinite(thr).any())
    for xs, ys, ts, first in zip(np.split(x, cut), np.split(y, cut), np.split(thr, cut),
                                 [True] + [False] * len(cut), strict=True):
        ax.plot(xs, ys, marker="o", ms=3, color="C0", label="iteration time" + (
            " (end to end)" if line.attrs["end_to_end"] else "") if first else None)
        if judged:  # a dash per iteration too: a stretch of one iteration has no line to draw
            ax.plot(xs, ts, drawstyle="steps-mid", color="tab:gray", ls="--", lw=0.8,
                    marker="_", ms=7,
                    label=f"{delta:g} x reference (irregular above)" if first else None)
    if not judged:
        ax.set_title(f"no iteration judged: the irregularity monitor needs "
                     f"{IrregularityConfig().min_history} before the first it judges", fontsize=8)
    for at in x[cut]:
        ax.axvline(at - 1, color="tab:gray", lw=0.6, ls=":")
    irr = [i for i in verdict.irregular_iterations if i in line.index]
    if irr:
        ax.scatter(line.loc[irr, "x"], line.loc[irr, "seconds"], color="red", zorder=3,
                   label="irregular")
    at = _round_ticks(line.index.to_numpy(), 8)
    ax.set_xticks(x[at], [str(line.index[i]) for i in at])
    ax.set_xlabel("iteration" + (" (dotted: iterations not logged)" if len(cut) else ""))
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def evidence_labels(evidence: tuple) -> list[str]:
    """One label per piece of evidence: the operator instance and iteration, then the rule's
    sentence (a slow flow's says how many instances its bar adds up)."""
    out = []
    for e in evidence:
        where = e.group + (f"#{e.seq}" if e.seq >= 0 else "") + f" it{e.iteration}"
        said = textwrap.shorten(f"{e.rule}: {e.detail}", 150, placeholder=" ...")
        out.append(where + "\n" + "\n".join(textwrap.wrap(said, 48)[:3]))
    return out


def rank_heat(iterations: pd.DataFrame, max_rows: int = _HEAT_ROWS
              ) -> tuple[pd.DataFrame, np.ndarray]:
    """The heat map's data: ``log2`` of each rank's communication time per iteration over the
    median rank's, and the first rank of each row.

    A straggler spends *less* time in communication than its peers (they wait for it) and the
    ranks of a slow link more, so both signs matter. Above ``max_rows`` ranks, consecutive ranks
    share a row that shows, per iteration, the value of its rank furthest from the median: a
    single deviating rank stays visible at any scale (an image of thousands of rows would
    otherwise drop or blur it).
    """
    heat = iterations.pivot_table(index="rank", columns="iteration", values="comm_us",
                                  aggfunc="sum")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_rel = np.log2(heat / heat.median(axis=0))
    log_rel = log_rel.replace([np.inf, -np.inf], np.nan)
    first = log_rel.index.to_numpy()
    n = len(log_rel)
    if n <= max_rows:
        return log_rel, first
    per = -(-n // max_rows)  # ceil: ranks per row
    values = log_rel.to_numpy(dtype=float)
    bins = np.arange(n) // per
    # per row and iteration, the value of largest magnitude (NaN only if the row has none)
    mag = np.where(np.isnan(values), -1.0, np.abs(values))
    rows = []
    for b in range(int(bins[-1]) + 1):
        block, bmag = values[bins == b], mag[bins == b]
        rows.append(block[bmag.argmax(axis=0), np.arange(values.shape[1])])
    starts = first[::per]
    return pd.DataFrame(np.vstack(rows), index=starts, columns=log_rel.columns), starts


def _round_ticks(labels: np.ndarray, most: int) -> np.ndarray:
    """Positions of at most about ``most`` ticks among sorted integer ``labels``: those that
    are multiples of a round step (1, 2 or 5 times a power of ten), evenly spread positions
    when too few are."""
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) == 0:
        return np.zeros(0, dtype=int)
    span = max(int(labels[-1] - labels[0]), 1)
    step = 1
    for power in range(19):
        step = next((m * 10 ** power for m in (1, 2, 5) if span / (m * 10 ** power) <= most),
                    0)
        if step:
            break
    at = np.flatnonzero(labels % max(step, 1) == 0)
    if len(at) >= 2:
        return at
    return np.unique(np.linspace(0, len(labels) - 1, min(len(labels), most)).round()
                     .astype(int))


def _warmup(n_iterations: int) -> int:
    """How many of the first logged iterations the heat map's colour scale leaves out: as many
    as the irregularity monitor judges without a reference, when there are three times as
    many. A job's first steps (communicator set-up, compilation, caches) are far off in
    either direction and would set a scale that leaves a fault pale."""
    warm = IrregularityConfig.min_history
    return warm if n_iterations >= 3 * warm else 0


def heat_limit(log_rel: pd.DataFrame) -> float:
    """The heat map's colour limit (``log2`` of the ratio, both ways): a robust extreme of the
    values (one wild value must not wash the map out), never below :data:`_HEAT_FLOOR`, read
    without the warm-up iterations (:func:`_warmup`; they are still drawn, saturated)."""
    values = log_rel.to_numpy(dtype=float)
    values = values[:, _warmup(values.shape[1]):]
    finite = np.abs(values[np.isfinite(values)])
    return max(float(np.quantile(finite, 0.999)) if finite.size else 0.0,
               float(np.log2(_HEAT_FLOOR)))


def _draw_heatmap(plt, verdict: Verdict, iterations: pd.DataFrame, path: Path) -> None:
    """Ranks x iterations, communication time over the median rank's on a diverging scale
    (a straggler's row short, a slow link's ranks long), the first suspects' ranks marked."""
    log_rel, starts = rank_heat(iterations)
    values = log_rel.to_numpy(dtype=float)
    lim = heat_limit(log_rel)
    warmup = _warmup(values.shape[1])
    fig, ax = plt.subplots(figsize=(8, 4.2))
    im = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim,
                   interpolation="nearest")
    ax.set_xlabel("iteration" + (f" (colour scale read without the first {warmup}: warm-up)"
                                 if warmup else ""))
    ax.set_ylabel("rank")
    grouped = len(starts) < len(iterations["rank"].unique())
    title = "communication time per rank / median rank" + (
        " (rows: the most deviating of each run of ranks)" if grouped else "")
    top = verdict.candidates[0] if verdict.candidates else None
    if top is not None and top.kind.value in ("nic", "link", "switch"):
        # its flows' ranks all wait on it alike, so their ratio to the median barely moves
        title += (f"\n#1 is a {top.kind.value}: its flows' ranks wait alike and hardly show "
                  "here; graph.png has its flows")
    ax.set_title(title, fontsize=9)
    bar = fig.colorbar(im, ax=ax)
    ticks = np.linspace(-lim, lim, 5)
    bar.set_ticks(ticks, labels=[f"{2.0 ** t:.2f}x" for t in ticks])
    at = _round_ticks(log_rel.columns.to_numpy(), 8)
    ax.set_xticks(at, [str(log_rel.columns[i]) for i in at])
    at = _round_ticks(starts, 12)
    ax.set_yticks(at, [str(starts[i]) for i in at])
    # the first suspects that sit on a few ranks (a GPU, its host or NIC, a link or leaf
    # switch of a few): arrows left of the map, one column per suspect; those behind many
    # ranks (a spine) are in graph.png
    marked = 0
    for i, cand in enumerate(verdict.candidates[:_HEAT_MARKS]):
        if not cand.ranks or len(cand.ranks) > _HEAT_MARK_RANKS:
            continue
        rows = sorted({int(np.searchsorted(starts, r, side="right")) - 1 for r in cand.ranks})
        ax.scatter([-0.075 - 0.025 * i] * len(rows), rows, marker=">", s=24, clip_on=False,
                   color=f"C{i}", label=f"#{i + 1} {cand.device}",
                   transform=ax.get_yaxis_transform(), zorder=4)
        marked += 1
    if marked:  # below the map, where it hides none of it; the axis label left of the arrows
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=marked, fontsize=7,
                  frameon=False)
        ax.set_ylabel("rank", labelpad=12 + 12 * marked)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _draw_compute(plt, verdict: Verdict, compute: pd.DataFrame, basis: str, path: Path
                  ) -> None:
    """Each rank's compute time per step over the median rank's (rank x iteration), the ranks
    of a stage-imbalance finding marked on the left; ``compute`` and ``basis`` as
    :func:`holmes_ml.localize.rules.step_compute` reads them (logged, or from the gaps)."""
    heat = compute.pivot_table(index="rank", columns="iteration", values="compute_us",
                               aggfunc="max")
    rel = heat / heat.median(axis=0)
    fig, ax = plt.subplots(figsize=(8, 4))
    im = ax.imshow(rel.to_numpy(dtype=float), aspect="auto", cmap="viridis",
                   interpolation="nearest")
    ax.set_xlabel("iteration")
    ax.set_ylabel("rank")
    ax.set_title("compute time per step, rank / median rank" if basis == "compute" else
                 "time outside communication per step (compute), rank / median rank",
                 fontsize=10)
    fig.colorbar(im, ax=ax, label="x median rank")
    # the columns are the logged iterations in order (their numbers need not be contiguous)
    at = _round_ticks(rel.columns.to_numpy(), 8)
    ax.set_xticks(at, [str(rel.columns[i]) for i in at])
    at = _round_ticks(rel.index.to_numpy(), 16)
    ax.set_yticks(at, [str(rel.index[i]) for i in at])
    rows = {r: i for i, r in enumerate(rel.index)}
    shown = 0
    for w in verdict.workload_findings:
        if w.kind != "stage-imbalance":
            continue
        marked = [rows[r] for r in w.ranks if r in rows]
        stage = f"pp {w.coords['pp']}" if w.coords and "pp" in w.coords else "heavier stage"
        # just right of the map, left of the colour bar: x in axes units, y in rows
        ax.scatter([1.012 + 0.02 * shown] * len(marked), marked, marker="<", color=f"C{3 + shown}",
                   s=12, clip_on=False, label=stage, transform=ax.get_yaxis_transform())
        shown += 1
    if shown:  # below the map, where it hides none of it
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=shown, fontsize=7,
                  frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _draw_graph(plt, graph: nx.Graph, path: Path) -> None:
    """Suspects on the right, the slow communicators that touch them on the left."""
    import networkx as nx

    suspects = sorted((d["suspect"], n) for n, d in graph.nodes(data=True)
                      if d.get("suspect", 0) > 0)[:_GRAPH_SUSPECTS]
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.set_axis_off()
    if not suspects:
        ax.text(0.5, 0.5, "no device blamed", ha="center", va="center")
    else:
        names = [n for _, n in suspects]
        touching = {n: _touching(graph, n) for n in names}
        comms = set().union(*touching.values())
        left = sorted(comms, key=lambda m: -graph.nodes[m]["abnormal_copies"])[:_GRAPH_COMMS]
        sub = nx.Graph(graph.subgraph(left + names))
        # a host meets its communicators through its GPUs: drawn dashed
        through = [(m, n) for n in names for m in touching[n]
                   if m in left and not graph.has_edge(m, n)]
        sub.add_edges_from(through, rel="through")
        # two columns, best first from the top: communicators left, suspects right
        pos = {n: (0.0, -i / max(len(left) - 1, 1)) for i, n in enumerate(left)}
        pos.update({n: (1.0, -i / max(len(names) - 1, 1)) for i, n in enumerate(names)})
        colours = [_KIND_COLOURS.get(sub.nodes[n]["kind"], "black") for n in sub]
        direct = [e for e in sub.edges if sub.edges[e].get("rel") != "through"]
        nx.draw_networkx_edges(sub, pos, edgelist=direct, ax=ax, alpha=0.4)
        if through:
            nx.draw_networkx_edges(sub, pos, edgelist=through, ax=ax, alpha=0.4, style="dashed")
        nx.draw_networkx_nodes(sub, pos, ax=ax, node_color=colours, node_size=120)
        for n in left:
            d = sub.nodes[n]
            ax.text(-0.03, pos[n][1], f"{n.split(':', 1)[1]} ({d['group_kind'] or '?'}, "
                    f"{d['abnormal_copies']} abnormal copies)", ha="right", va="center",
                    fontsize=7)
        for n in names:
            d = sub.nodes[n]
            ax.text(1.03, pos[n][1], f"#{d['suspect']} {n}\nscore {d['score']:.2f}",
                    ha="left", va="center", fontsize=8)
        # a suspect GPU's own abnormal copies: a straggler's copies are the normal ones
        own = {(u, v): f"its own: {d['abnormal_copies']}"
               for u, v, d in sub.edges(data=True) if d.get("rel") == "member"}
        if own:
            nx.draw_networkx_edge_labels(sub, pos, own, ax=ax, font_size=6, label_pos=0.7)
        ax.set_xlim(-1.0, 1.8)
        hidden = len(comms) - min(len(comms), _GRAPH_COMMS)
        ax.set_title(f"slow communicators touching the first {len(names)} suspect(s)"
                     + (f" ({hidden} more not drawn)" if hidden else "")
                     + ("\n(dashed: through the host's GPUs and NICs)" if through else ""),
                     fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _touching(graph: nx.Graph, node: str) -> set[str]:
    """The communicators next to ``node``, or, for a host, next to its GPUs and NICs."""
    comms = {m for m in graph.neighbors(node) if graph.nodes[m]["kind"] == "communicator"}
    if comms or graph.nodes[node].get("kind") != "host":
        return comms
    return {c for m in graph.neighbors(node) for c in graph.neighbors(m)
            if graph.nodes[c]["kind"] == "communicator"}
