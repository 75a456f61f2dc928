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

Checks (before any column is used)
----------------------------------
* meta: UTF-8 text; ``dp_size``, ``pp_size``, ``tp_size`` (and ``dsp_size``, ``world_size`` when
  given) integers in ``[1, MAX_WORLD]``, each given once; ``world_size`` equals
  ``dp_size * pp_size * tp_size * dsp_size``.
* trace: ``dp_rank`` in ``[0, dp_size)``, ``stage`` in ``[0, pp_size)``, ``rank`` in
  ``[0, world_size)``, ``step`` >= 0 and ``seq_id`` integers (no fractions, NaN or text);
  ``start_ts`` and ``duration`` finite seconds >= 0; one rank per (dp_rank, stage) worker and
  one worker per rank; every P2P / embedding op's peer worker recorded; with ``tp_size > 1``
  the rank of a layernorm all-reduce is a multiple of ``tp_size`` (TP rank 0).
  Errors name the file, column, 0-based data row, value and what was expected.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml._text import shown
from holmes_ml.io._common import MAX_WORLD, as_int, head_bytes
from holmes_ml.io.schema import REQUIRED_COLUMNS, SchemaError

logger = logging.getLogger(__name__)

#: Columns a what-if trace must have.
TRACE_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")
#: Further columns of the artifact's traces (micro-batch bookkeeping), not used here.
EXTRA_COLUMNS = ("mc", "mb_id", "gmc")
#: Columns that mark a what-if trace in auto-detection (no CommOps table has them).
_CORE_COLUMNS = ("dp_rank", "stage", "optype")
#: Parallel sizes of the meta file; the first three are required.
SIZE_KEYS = ("dp_size", "pp_size", "tp_size", "dsp_size", "world_size")
_COMM = {
    "forward-send": "send", "backward-send": "send",
    "forward-recv": "recv", "backward-recv": "recv",
    "grads-reduce-scatter": "reduce_scatter", "params-all-gather": "all_gather",
    "embedding-grads-all-reduce": "all_reduce", "layernorm-grads-all-reduce": "all_reduce",
}
_COMPUTE = {"forward-compute", "backward-compute", "optimizer", "optimizer-clip-main-grad", "gc",
            "first-op"}
_META_EXAMPLE = "lines like 'dp_size: 4', 'pp_size: 4', 'tp_size: 4'"


def read_meta(path: str | Path) -> dict[str, int]:
    """Parallel sizes from a ``meta-*.yaml`` (flat ``key: value`` lines, no YAML library needed).

    Every integer-valued key is returned; the sizes are checked (see :func:`check_meta`) and
    ``dsp_size`` (1) and ``world_size`` (their product) are filled in when absent.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "meta-X.yaml")
    ...     _ = open(p, "w").write("dp_size: 2\\npp_size: 4  # stages\\ntp_size: 0\\n")
    ...     read_meta(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    holmes_ml.io.schema.SchemaError: .../meta-X.yaml, tp_size, line 3: out of range (got 0; expected an integer in [1, 1048576])
    """
    p = Path(path)
    source = str(p)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SchemaError(f"cannot read the parallel sizes file: {exc.strerror or exc}",
                          source=source, expected=f"a readable meta-*.yaml with {_META_EXAMPLE}"
                          ) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SchemaError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            source=source, line=raw[:exc.start].count(b"\n") + 1,
            expected=f"a UTF-8 YAML file with {_META_EXAMPLE}",
        ) from None
    meta: dict[str, int] = {}
    lines: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:(.*)$", line)
        if not m:
            continue
        key = m.group(1)
        value = re.sub(r"\s+#.*$|^#.*$", "", m.group(2).strip()).strip()
        if key in SIZE_KEYS:
            if key in lines:
                raise SchemaError("given twice", source=source, parameter=key, line=lineno,
                                  expected=f"one '{key}:' line (the first is line {lines[key]})")
            lines[key] = lineno
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            try:
                meta[key] = as_int(value, key, source, lo=1, hi=MAX_WORLD)
            except SchemaError as exc:
                raise exc.at(line=lineno) from None
        elif re.fullmatch(r"-?\d{1,18}", value):
            meta[key] = int(value)
    return check_meta(meta, source, lines)


def check_meta(meta: Mapping[str, Any], source: str | None = None,
               lines: Mapping[str, int] | None = None) -> dict[str, int]:
    """The parallel sizes of ``meta`` checked, with ``dsp_size`` and ``world_size`` filled in.

    ``source`` names the meta file (or argument) in errors; ``lines`` the line of each key.

    >>> check_meta({"dp_size": 2, "pp_size": 4, "tp_size": 1})["world_size"]
    8
    >>> check_meta({"dp_size": 2, "pp_size": 4, "tp_size": 1, "world_size": 16}, "meta-X.yaml")
    Traceback (most recent call last):
    ...
    holmes_ml.io.schema.SchemaError: meta-X.yaml, world_size: not the product of the parallel sizes (got 16; expected dp_size * pp_size * tp_size * dsp_size = 2 * 4 * 1 * 1 = 8)
    """
    lines = lines or {}
    out = {k: v for k, v in meta.items() if k not in SIZE_KEYS}
    for key in SIZE_KEYS:
        if meta.get(key) is None:
            if key in ("dsp_size", "world_size"):
                continue
            raise SchemaError("missing parallel size", source=source, parameter=key,
                              expected=f"an integer line like '{key}: 4'")
        out[key] = as_int(meta[key], key, source, lo=1, hi=MAX_WORLD)
    out.setdefault("dsp_size", 1)
    sizes = [out[k] for k in ("dp_size", "pp_size", "tp_size", "dsp_size")]
    product = int(np.prod(sizes, dtype=object))
    if "world_size" in out and out["world_size"] != product:
        raise SchemaError(
            "not the product of the parallel sizes", source=source, parameter="world_size",
            line=lines.get("world_size"), value=out["world_size"],
            expected="dp_size * pp_size * tp_size * dsp_size = "
            + " * ".join(map(str, sizes)) + f" = {product}")
    if product > MAX_WORLD:
        raise SchemaError(
            "parallel sizes too large", source=source, parameter="world_size", value=product,
            expected=f"dp_size * pp_size * tp_size * dsp_size <= {MAX_WORLD}")
    out["world_size"] = product
    return out


def meta_path_for(path: str | Path) -> Path:
    """``trace-AR.parquet`` -> ``meta-AR.yaml`` in the same directory."""
    p = Path(path)
    name = re.sub(r"^trace-", "meta-", p.name.split(".")[0]) + ".yaml"
    return p.with_name(name)


def is_whatif_columns(names: set[str] | list[str] | tuple[str, ...]) -> bool:
    """Whether a table with columns ``names`` is a what-if trace, possibly missing a column.

    Two of ``dp_rank, stage, optype`` and more than half of the artifact's eleven columns
    make a what-if trace (the reader then names any missing column); a table with every
    CommOps column is a native table whatever else it holds.

    >>> is_whatif_columns(TRACE_COLUMNS[:-1]), is_whatif_columns(["rank", "step", "optype"])
    (True, False)
    """
    cols = set(names)
    if set(REQUIRED_COLUMNS) <= cols:
        return False
    return (len(cols & set(_CORE_COLUMNS)) >= 2
            and 2 * len(cols & set(TRACE_COLUMNS + EXTRA_COLUMNS))
            > len(TRACE_COLUMNS + EXTRA_COLUMNS))


def looks_like_bytedance(path: str | Path) -> bool:
    """True for a Parquet file (any name) whose schema has (most of) the what-if columns."""
    try:
        if head_bytes(path, 4) != b"PAR1":
            return False
    except (SchemaError, OSError):
        return False
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (pa.ArrowException, OSError):
        # A truncated or corrupt Parquet file: not ours to report; the native reader names the
        # file and the problem in one line.
        return False
    return is_whatif_columns(names)


def _numbers(s: pd.Series) -> np.ndarray:
    """``s`` as float64 with NaN for anything that is not a number (text, null, booleans)."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        s = s.astype(object)
    if pd.api.types.is_bool_dtype(s.dtype):
        return np.full(len(s), np.nan)
    if not pd.api.types.is_numeric_dtype(s.dtype):
        s = pd.to_numeric(s, errors="coerce")
    return np.asarray(s.to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)


def _int_column(df: pd.DataFrame, column: str, source: str, *, lo: int | None = None,
                hi: int | None = None, why: str = "") -> np.ndarray:
    """Column ``column`` as int64, every value an integer in ``[lo, hi]``, else a SchemaError
    naming the first offending row."""
    s = df[column]
    expected = "an integer" + (f" in [{lo}, {hi}]" if lo is not None and hi is not None else
                               f" >= {lo}" if lo is not None else "") + why
    if (pd.api.types.is_integer_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype)
            and not s.hasnans):
        if pd.api.types.is_unsigned_integer_dtype(s.dtype) and len(s) and \
                int(s.max()) > np.iinfo(np.int64).max:
            i = int(np.argmax(s.to_numpy()))
            raise SchemaError("out of range", source=source, column=column, row=i,
                              value=shown(s.iloc[i]), expected=expected)
        values: np.ndarray = s.to_numpy(dtype=np.int64)
    else:
        values = _numbers(s)
        with np.errstate(invalid="ignore"):
            notint = ~np.isfinite(values) | (values != np.floor(values)) | (
                np.abs(values) >= 2.0 ** 63)
        if notint.any():
            i = int(np.flatnonzero(notint)[0])
            raise SchemaError("not an integer", source=source, column=column, row=i,
                              value=shown(s.iloc[i]), expected=expected)
    bad = np.zeros(len(values), dtype=bool)
    if lo is not None:
        bad |= values < lo
    if hi is not None:
        bad |= values > hi
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SchemaError("out of range", source=source, column=column, row=i,
                          value=int(values[i]), expected=expected)
    return values.astype(np.int64, copy=False)


def _seconds_column(df: pd.DataFrame, column: str, source: str) -> np.ndarray:
    """Column ``column`` as float64 seconds, finite and >= 0, else a SchemaError."""
    s = df[column]
    f = _numbers(s)
    expected = "a finite number of seconds >= 0"
    finite = np.isfinite(f)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise SchemaError("not a finite number", source=source, column=column, row=i,
                          value=shown(s.iloc[i]), expected=expected)
    if (f < 0).any():
        i = int(np.flatnonzero(f < 0)[0])
        raise SchemaError("negative time", source=source, column=column, row=i,
                          value=float(f[i]), expected=expected)
    return f


def _one_to_one(dp: np.ndarray, st: np.ndarray, rank: np.ndarray, pp_size: int,
                source: str) -> None:
    """Each (dp_rank, stage) worker is one rank and each rank one worker."""
    key = dp * pp_size + st
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    other = rank != rank[first][inv]
    if other.any():
        i = int(np.flatnonzero(other)[0])
        j = int(first[inv[i]])
        raise SchemaError(
            f"a second rank for the worker at dp_rank {dp[i]}, stage {st[i]}", source=source,
            column="rank", row=i, value=int(rank[i]),
            expected=f"rank {rank[j]} as in row {j} (one rank per (dp_rank, stage))")
    _, first, inv = np.unique(rank, return_index=True, return_inverse=True)
    other = key != key[first][inv]
    if other.any():
        i = int(np.flatnonzero(other)[0])
        j = int(first[inv[i]])
        col, got, want = (("dp_rank", dp[i], dp[j]) if dp[i] != dp[j] else
                          ("stage", st[i], st[j]))
        raise SchemaError(
            f"rank {rank[i]} recorded as a second worker", source=source, column=col, row=i,
            value=int(got), expected=f"{col} {want} as in row {j} (one worker per rank)")


def read_bytedance(path: str | Path, meta: Mapping[str, Any] | str | Path | None = None
                   ) -> pd.DataFrame:
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

    Raises
    ------
    SchemaError
        When the trace or meta is malformed or they disagree (see the module docstring).

    Examples
    --------
    >>> ops = read_bytedance("realdata/bytedance-whatif/trace-AR.parquet")  # doctest: +SKIP
    """
    import pyarrow as pa

    from holmes_ml.io._common import content_kind

    source = str(path)
    if not Path(path).is_file():
        raise SchemaError("not a file" if Path(path).exists() else "file not found",
                          source=source, expected="a ByteDance what-if trace-*.parquet")
    head = head_bytes(path, 1024)
    if head[:4] != b"PAR1":
        raise SchemaError(f"not a Parquet file: this looks like {content_kind(head) or 'JSON'}",
                          source=source, expected="a ByteDance what-if trace-*.parquet")
    if isinstance(meta, Mapping):
        meta_name = "the meta argument"
        meta = check_meta(meta, meta_name)
    else:
        mp = Path(meta) if meta is not None else meta_path_for(path)
        if not mp.is_file():
            raise SchemaError(
                f"the parallel sizes file {mp} does not exist", source=source,
                expected=f"{mp.name} next to the trace, with {_META_EXAMPLE}; "
                "or read_bytedance(meta=...)",
            )
        meta_name = mp.name
        meta = read_meta(mp)
    try:
        df = pd.read_parquet(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise SchemaError(f"cannot read Parquet: {exc}", source=source,
                          expected="a complete ByteDance what-if trace-*.parquet") from exc
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(
            f"missing what-if column{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
            source=source, column=missing[0], expected="columns " + ", ".join(TRACE_COLUMNS))
    dup = [c for c in TRACE_COLUMNS if (df.columns == c).sum() > 1]
    if dup:
        raise SchemaError("column given twice", source=source, column=dup[0],
                          expected="each what-if column once")
    # Rows are reported as 0-based data rows of the file, whatever index pandas restored.
    df = df.reset_index(drop=True)
    optype = df["optype"].astype(str)
    unknown = ~optype.isin(set(_COMM) | _COMPUTE)
    if unknown.any():
        i = int(np.flatnonzero(unknown.to_numpy())[0])
        raise SchemaError("unknown what-if optype", source=source, column="optype", row=i,
                          value=shown(df["optype"].iloc[i]),
                          expected="one of " + ", ".join(sorted(set(_COMM) | _COMPUTE)))
    dp_size, pp_size, tp_size = meta["dp_size"], meta["pp_size"], meta["tp_size"]
    world = meta["world_size"]

    def within(key: str, size: int) -> str:
        return f" ({key} {size} in {meta_name})"

    dp_all = _int_column(df, "dp_rank", source, lo=0, hi=dp_size - 1,
                         why=within("dp_size", dp_size))
    st_all = _int_column(df, "stage", source, lo=0, hi=pp_size - 1,
                         why=within("pp_size", pp_size))
    rank_all = _int_column(df, "rank", source, lo=0, hi=world - 1,
                           why=within("world_size", world))
    step = _int_column(df, "step", source, lo=0)
    seq_id = _int_column(df, "seq_id", source)
    start_ts = _seconds_column(df, "start_ts", source)
    duration = _seconds_column(df, "duration", source)
    _one_to_one(dp_all, st_all, rank_all, pp_size, source)
    df = df.assign(dp_rank=dp_all, stage=st_all, rank=rank_all, step=step, seq_id=seq_id,
                   optype=optype, start_ts=start_ts, duration=duration)
    # A row repeated exactly is the same record written twice: kept, it would take the next
    # message's place in the send/recv pairing (messages are counted, not named), so every
    # later message of its pair would meet the wrong partner. The index keeps file rows.
    again = df.duplicated(subset=list(TRACE_COLUMNS), keep="first").to_numpy()
    if again.any():
        logger.warning("%s: dropped %d row(s) repeating an earlier row exactly (first: row %d)"
                       " - the same record written twice?", source, int(again.sum()),
                       int(np.flatnonzero(again)[0]))
        df = df.loc[~again]
        start_ts, duration = start_ts[~again], duration[~again]

    # Synthetic absolute timeline: recorded steps placed back to back.
    step_end = (df["start_ts"] + df["duration"]).groupby(df["step"]).max().sort_index()
    offset = step_end.cumsum().shift(fill_value=0.0)
    t0_s = df["step"].map(offset).to_numpy() + df["start_ts"].to_numpy()
    with np.errstate(over="ignore"):  # an absurd time overflows to inf: refused just below
        late = (t0_s + duration) * 1e9 >= 2.0 ** 63
    if late.any():
        # name the row that stretches its step the most, and the larger of its two times
        i = int(np.argmax(start_ts + duration))
        column = "duration" if duration[i] >= start_ts[i] else "start_ts"
        raise SchemaError(
            "times too large: the recorded steps placed back to back end beyond 2**63 ns",
            source=source, column=column, row=int(df.index[i]),
            value=float(df[column].iloc[i]),
            expected="seconds since the start of the step (start_ts) and op durations, a step "
            "lasting hours at most")

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
    rows = c.index.to_numpy()  # data rows of the file, for messages
    dp = c["dp_rank"].to_numpy(np.int64)
    st = c["stage"].to_numpy(np.int64)
    rank = c["rank"].to_numpy(np.int64)
    opt = c["optype"].to_numpy()
    opt_s = opt.astype(str)
    # forward messages flow stage s -> s+1, backward ones s+1 -> s.
    peer_stage = np.select(
        [opt_s == "forward-send", opt_s == "forward-recv",
         opt_s == "backward-send", opt_s == "backward-recv"],
        [st + 1, st - 1, st - 1, st + 1], default=-2)
    is_p2p = peer_stage != -2
    # Recorded rank at [dp, stage + 1]; -1 where none (stages -1 and pp_size are padding).
    lut = np.full((dp_size, pp_size + 2), -1, dtype=np.int64)
    lut[dp_all, st_all + 1] = rank_all
    peer = np.where(is_p2p, lut[dp, np.clip(peer_stage + 1, 0, pp_size + 1)], -1)
    if (is_p2p & (peer < 0)).any():
        i = int(np.flatnonzero(is_p2p & (peer < 0))[0])
        ps = int(peer_stage[i])
        if not 0 <= ps < pp_size:
            raise SchemaError(
                f"{opt_s[i]} on stage {st[i]} needs pipeline stage {ps}, which does not exist",
                source=source, column="optype", row=int(rows[i]), value=opt_s[i],
                expected="forward-send and backward-recv on stages 0.."
                f"{pp_size - 2}, forward-recv and backward-send on stages 1..{pp_size - 1}"
                + within("pp_size", pp_size))
        raise SchemaError(
            f"{opt_s[i]} needs the worker at dp_rank {dp[i]}, stage {ps}, which is not in "
            "the trace", source=source, column="stage", row=int(rows[i]), value=int(st[i]),
            expected="both ends of every pipeline message recorded")

    lo, hi = np.minimum(rank, peer), np.maximum(rank, peer)
    by_stage: dict[int, list[str]] = {}
    for (_, s), r in sorted(worker.items()):
        by_stage.setdefault(s, []).append(str(r))
    stage_ranks = {s: " ".join(rs) for s, rs in by_stage.items()}
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
    _check_embedding(emb, dp, st, lut, rows, pp_size, source, within("pp_size", pp_size))
    group[emb] = [f"emb-{d}" for d in dp[emb]]
    first, last = lut[dp[emb], 1], lut[dp[emb], pp_size]
    granks[emb] = [f"{a} {b}" if a != b else f"{a}" for a, b in zip(first, last, strict=True)]
    kind[emb] = "emb"
    ln = opt == "layernorm-grads-all-reduce"
    if tp_size > 1:
        off = ln & (rank % tp_size != 0)
        if off.any():
            i = int(np.flatnonzero(off)[0])
            raise SchemaError(
                "the rank of a layernorm all-reduce is not a TP-rank-0 worker", source=source,
                column="rank", row=int(rows[i]), value=int(rank[i]),
                expected=f"a multiple of tp_size {tp_size} in {meta_name} (its TP group is "
                f"ranks rank..rank+{tp_size - 1})")
    group[ln] = [f"tp-{d}-{s}" for d, s in zip(dp[ln], st[ln], strict=True)]
    tp_ranks = {r: " ".join(str(r + t) for t in range(tp_size)) for r in np.unique(rank[ln])}
    granks[ln] = [tp_ranks[r] for r in rank[ln]]
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


def _check_embedding(emb: np.ndarray, dp: np.ndarray, st: np.ndarray, lut: np.ndarray,
                     rows: np.ndarray, pp_size: int, source: str, why: str) -> None:
    """Embedding all-reduces run on the first and last stage, both of them recorded."""
    if not emb.any():
        return
    middle = emb & (st != 0) & (st != pp_size - 1)
    if middle.any():
        i = int(np.flatnonzero(middle)[0])
        raise SchemaError(
            "embedding-grads-all-reduce on a middle pipeline stage", source=source,
            column="stage", row=int(rows[i]), value=int(st[i]),
            expected=f"the first or last stage, 0 or {pp_size - 1}{why}")
    for s in (0, pp_size - 1):
        absent = emb & (lut[dp, s + 1] < 0)
        if absent.any():
            i = int(np.flatnonzero(absent)[0])
            raise SchemaError(
                f"embedding-grads-all-reduce needs the worker at dp_rank {dp[i]}, stage {s}, "
                "which is not in the trace", source=source, column="dp_rank",
                row=int(rows[i]), value=int(dp[i]),
                expected="both ends of the embedding group (first and last stage) recorded")
