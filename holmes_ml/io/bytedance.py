"""ByteDance what-if (OSDI'25 StragglerAnalysis) per-op parquet traces into the CommOps table.

Input: ``trace-<name>.parquet`` with columns ``dp_rank, stage, rank, step, optype, start_ts,
duration, seq_id, mc, mb_id, gmc`` and, next to it, ``meta-<name>.yaml`` with the parallel
sizes (``dp_size, pp_size, tp_size, dsp_size, world_size``). Only the TP-rank-0 worker of each
(DP rank, stage) is recorded.

Mapping (documented choices)
----------------------------
* ``forward-send``/``backward-send`` -> ``send``, ``forward-recv``/``backward-recv`` -> ``recv``
  with ``peer`` the neighbouring stage's recorded rank (same DP rank; forward goes to stage+1,
  backward to stage-1). Group ``pp-<lo>-<hi>`` holds the two ranks; ``seq`` counts the messages
  of one direction, so the k-th send on a pair matches the k-th recv.
* ``grads-reduce-scatter`` -> ``reduce_scatter``, ``params-all-gather`` -> ``all_gather`` on the
  DP group ``dp-<stage>`` of the recorded ranks of that stage.
* ``embedding-grads-all-reduce`` -> ``all_reduce`` on ``emb-<dp>`` (first and last stage).
* ``layernorm-grads-all-reduce`` -> ``all_reduce`` on the TP group ``tp-<dp>-<stage>`` (the tp
  ranks of that worker, only one of which is recorded); dropped when ``tp_size == 1`` because a
  one-member group moves no data.
* Compute ops (forward/backward compute, optimizer, gc) are not communication and are dropped;
  their per-step total on the rank is kept as the extra column ``step_compute_us``.
* Times: ``start_ts``/``duration`` are seconds relative to the step start. Recorded steps are
  not contiguous, so ``start_ns`` is placed on a synthetic timeline where each step starts after
  the previous recorded step ended (relative order and durations are exact).
* ``nbytes`` is not in the trace and is 0. Coordinates ``dp``, ``pp``, ``tp`` are added.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd

from holmes_ml.io._common import head_bytes
from holmes_ml.io.schema import SchemaError

logger = logging.getLogger(__name__)

#: Columns a what-if trace must have.
TRACE_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")
_COMM = {
    "forward-send": "send", "backward-send": "send",
    "forward-recv": "recv", "backward-recv": "recv",
    "grads-reduce-scatter": "reduce_scatter", "params-all-gather": "all_gather",
    "embedding-grads-all-reduce": "all_reduce", "layernorm-grads-all-reduce": "all_reduce",
}
_COMPUTE = {"forward-compute", "backward-compute", "optimizer", "optimizer-clip-main-grad", "gc",
            "first-op"}


def read_meta(path: str | Path) -> dict[str, int]:
    """Parallel sizes from a ``meta-*.yaml`` (flat ``key: value`` lines, no YAML library needed)."""
    meta: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z_]+)\s*:\s*(-?\d+)\s*$", line)
        if m:
            meta[m.group(1)] = int(m.group(2))
    for key in ("dp_size", "pp_size", "tp_size"):
        if key not in meta:
            raise SchemaError("missing parallel size", source=str(path), column=key,
                              expected="an integer line like 'dp_size: 4'")
    meta.setdefault("dsp_size", 1)
    meta.setdefault("world_size", meta["dp_size"] * meta["pp_size"] * meta["tp_size"]
                    * meta["dsp_size"])
    return meta


def meta_path_for(path: str | Path) -> Path:
    """``trace-AR.parquet`` -> ``meta-AR.yaml`` in the same directory."""
    p = Path(path)
    name = re.sub(r"^trace-", "meta-", p.name.split(".")[0]) + ".yaml"
    return p.with_name(name)


def looks_like_bytedance(path: str | Path) -> bool:
    """True for a parquet file whose schema has the what-if columns."""
    if not str(path).endswith(".parquet") or head_bytes(path, 4) != b"PAR1":
        return False
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (pa.ArrowException, OSError):
        # A truncated or corrupt Parquet file: not ours to report; the native reader names the
        # file and the problem in one line.
        return False
    return set(TRACE_COLUMNS) <= names


def read_bytedance(path: str | Path, meta: dict[str, int] | str | Path | None = None) -> pd.DataFrame:
    """Read one what-if trace into an unvalidated CommOps table.

    Parameters
    ----------
    path:
        ``trace-*.parquet``.
    meta:
        Parallel sizes, or the path of the ``meta-*.yaml``; by default the sibling file.

    Returns
    -------
    pandas.DataFrame
        Canonical columns plus ``group_ranks``, ``peer``, ``group_kind``, ``dp``, ``pp``, ``tp``
        and ``step_compute_us``.

    Examples
    --------
    >>> ops = read_bytedance("realdata/bytedance-whatif/trace-AR.parquet")  # doctest: +SKIP
    """
    import pyarrow as pa

    from holmes_ml.io._common import content_kind

    source = str(path)
    head = head_bytes(path, 1024)
    if head[:4] != b"PAR1":
        raise SchemaError(f"not a Parquet file: this looks like {content_kind(head) or 'JSON'}",
                          source=source, expected="a ByteDance what-if trace-*.parquet")
    if not isinstance(meta, dict):
        mp = Path(meta) if meta is not None else meta_path_for(path)
        if not mp.is_file():
            raise SchemaError(
                f"the parallel sizes file {mp} does not exist", source=source,
                expected=f"{mp.name} next to the trace, with lines like 'dp_size: 4', "
                "'pp_size: 4', 'tp_size: 4'; or read_bytedance(meta=...)",
            )
        meta = read_meta(mp)
    try:
        df = pd.read_parquet(path)
    except (pa.ArrowException, OSError) as exc:
        raise SchemaError(f"cannot read Parquet: {exc}", source=source,
                          expected="a complete ByteDance what-if trace-*.parquet") from exc
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"missing what-if column(s) {', '.join(missing)}", source=source,
                          column=missing[0], expected="columns " + ", ".join(TRACE_COLUMNS))
    optype = df["optype"].astype(str)
    unknown = ~optype.isin(set(_COMM) | _COMPUTE)
    if unknown.any():
        i = int(np.flatnonzero(unknown.to_numpy())[0])
        raise SchemaError("unknown what-if optype", source=source, column="optype", row=i,
                          value=optype.iloc[i],
                          expected="one of " + ", ".join(sorted(set(_COMM) | _COMPUTE)))
    dp_size, pp_size, tp_size = meta["dp_size"], meta["pp_size"], meta["tp_size"]
    df = df.assign(optype=optype, start_ts=df["start_ts"].astype(np.float64),
                   duration=df["duration"].astype(np.float64))

    # Synthetic absolute timeline: recorded steps placed back to back.
    step_end = (df["start_ts"] + df["duration"]).groupby(df["step"]).max().sort_index()
    offset = step_end.cumsum().shift(fill_value=0.0)
    t0_s = df["step"].map(offset).to_numpy() + df["start_ts"].to_numpy()

    is_compute = df["optype"].isin(_COMPUTE).to_numpy()
    compute = df.loc[is_compute].groupby(["rank", "step"])["duration"].sum() * 1e6

    # Recorded rank of each (dp, stage) worker (tp rank 0).
    workers = df.drop_duplicates(["dp_rank", "stage"]).set_index(["dp_rank", "stage"])["rank"]
    worker = {(int(d), int(s)): int(r) for (d, s), r in workers.items()}

    if is_compute.all():
        raise SchemaError("no communication op in the trace", source=source, column="optype",
                          expected="some of " + ", ".join(sorted(_COMM)))
    c = df.loc[~is_compute].copy()
    c["t0_s"] = t0_s[~is_compute]
    c = c.sort_values(["rank", "step", "start_ts", "seq_id"], kind="stable")
    dp = c["dp_rank"].to_numpy(np.int64)
    st = c["stage"].to_numpy(np.int64)
    rank = c["rank"].to_numpy(np.int64)
    opt = c["optype"].to_numpy()
    opt_s = opt.astype(str)
    # forward messages flow stage s -> s+1, backward ones s+1 -> s.
    peer_stage = np.select(
        [opt_s == "forward-send", opt_s == "forward-recv",
         opt_s == "backward-send", opt_s == "backward-recv"],
        [st + 1, st - 1, st - 1, st + 1], default=-1)
    is_p2p = peer_stage != -1
    lut = np.full((dp_size + 1, pp_size + 2), -1, dtype=np.int64)
    for (d, s_), r in worker.items():
        lut[d, s_ + 1] = r
    peer = np.where(is_p2p, lut[np.clip(dp, 0, dp_size), np.clip(peer_stage + 1, 0, pp_size + 1)],
                    -1)
    if (is_p2p & (peer < 0)).any():
        i = int(np.flatnonzero(is_p2p & (peer < 0))[0])
        raise SchemaError("pipeline peer stage not recorded", source=source, column="stage",
                          value=int(st[i]), expected=f"stages 0..{pp_size - 1} for dp {dp[i]}")

    lo, hi = np.minimum(rank, peer), np.maximum(rank, peer)
    stage_ranks = {s: " ".join(str(worker[(d, s)]) for d in range(dp_size) if (d, s) in worker)
                   for s in range(pp_size)}
    group = np.empty(len(c), dtype=object)
    granks = np.empty(len(c), dtype=object)
    kind = np.empty(len(c), dtype=object)
    group[is_p2p] = [f"pp-{a}-{b}" for a, b in zip(lo[is_p2p], hi[is_p2p], strict=True)]
    granks[is_p2p] = [f"{a} {b}" for a, b in zip(lo[is_p2p], hi[is_p2p], strict=True)]
    kind[is_p2p] = "pp"
    dpm = np.isin(opt, ["grads-reduce-scatter", "params-all-gather"])
    group[dpm] = [f"dp-{s}" for s in st[dpm]]
    granks[dpm] = [stage_ranks[s] for s in st[dpm]]
    kind[dpm] = "dp"
    emb = opt == "embedding-grads-all-reduce"
    group[emb] = [f"emb-{d}" for d in dp[emb]]
    granks[emb] = [f"{worker.get((d, 0), -1)} {worker.get((d, pp_size - 1), -1)}"
                   for d in dp[emb]]
    kind[emb] = "emb"
    ln = opt == "layernorm-grads-all-reduce"
    group[ln] = [f"tp-{d}-{s}" for d, s in zip(dp[ln], st[ln], strict=True)]
    granks[ln] = [" ".join(str(r + t) for t in range(tp_size)) for r in rank[ln]]
    kind[ln] = "tp"

    out = pd.DataFrame({
        "iteration": c["step"].to_numpy(np.int64),
        "rank": rank,
        "op": c["optype"].map(_COMM).to_numpy(),
        "group": group,
        "seq": 0,
        "nbytes": np.zeros(len(c), dtype=np.int64),
        "start_ns": np.round(c["t0_s"].to_numpy() * 1e9).astype(np.int64),
        "duration_us": c["duration"].to_numpy() * 1e6,
        "group_ranks": granks,
        "peer": peer,
        "group_kind": kind,
        "dp": dp, "pp": st, "tp": np.zeros(len(c), dtype=np.int64),
        "step_compute_us": compute.reindex(
            pd.MultiIndex.from_arrays([rank, c["step"].to_numpy()]), fill_value=0.0
        ).to_numpy(np.float64),
        "_dir": np.where(is_p2p, np.char.partition(opt_s, "-")[:, 0], ""),
    })
    if tp_size == 1:
        out = out.loc[~ln].reset_index(drop=True)
    # seq: k-th op of this rank in this group (per direction for P2P), over the whole trace.
    out["seq"] = out.groupby(["rank", "group", "_dir"], sort=False).cumcount().astype(np.int64)
    logger.debug("%s: %d comm ops of %d ranks", source, len(out), out["rank"].nunique())
    return out.drop(columns="_dir")
