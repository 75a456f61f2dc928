"""The canonical CommOps table: one row per communication operator executed by one rank.

Every reader produces this table and everything downstream (features, detectors, localization,
serving) reads only this table. :func:`validate` is the single gatekeeper: it coerces dtypes and
raises :class:`SchemaError` naming the source, column, row and value when the input is wrong.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from holmes_ml._text import shown

#: Operator types the schema accepts.
OP_TYPES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "barrier",
    "send",
    "recv",
)
COLLECTIVE_OPS: frozenset[str] = frozenset(OP_TYPES) - {"send", "recv"}
P2P_OPS: frozenset[str] = frozenset({"send", "recv"})

#: Required columns and their kind (``int``, ``str`` or ``float``).
REQUIRED_COLUMNS: dict[str, str] = {
    "iteration": "int",
    "rank": "int",
    "op": "str",
    "group": "str",
    "seq": "int",
    "nbytes": "int",
    "start_ns": "int",
    "duration_us": "float",
}
#: Optional columns the schema knows; other extra columns are kept as they are.
OPTIONAL_COLUMNS: dict[str, str] = {
    # space-separated global ranks of the group, in group order; categorical once validated
    # (one copy per communicator: an 8,192-rank list is 40 kB, on every row of its group)
    "group_ranks": "str",
    "peer": "int",  # P2P peer global rank, -1 for collectives
    "host": "str",
    "group_kind": "str",  # tp, dp, pp, ep, cp, ... (free text, lower case)
    "job": "str",
    # the rank's compute time in the step (the same on each of its rows of the step), where the
    # logs carry it: the stage-imbalance workload finding reads it
    "step_compute_us": "float",
}
#: Label columns written by the simulator (never used as features): ``abnormal`` (prolonged
#: by the fault beyond its fault-free spread), ``fault_id`` and ``affected`` (prolonged by the
#: fault at all); see :mod:`holmes_ml.simulator.engine`.
LABEL_COLUMNS: tuple[str, ...] = ("abnormal", "fault_id", "affected")

_NUMPY_DTYPES = {"int": np.int64, "float": np.float64}

#: Facts that every row of one rank or one communicator shares (:func:`validate` checks them
#: within a table, :func:`facts_of` lists them to check tables read later): the column ->
#: (its owner column, how a message names it).
FACTS: dict[str, tuple[str, str]] = {
    "host": ("rank", "the host of rank {key}"),
    "group_ranks": ("group", "the members of communicator {key!r}"),
    "group_kind": ("group", "the kind of communicator {key!r}"),
}


def without_labels(ops: pd.DataFrame) -> pd.DataFrame:
    """``ops`` without the simulator's :data:`LABEL_COLUMNS` (what a real log would hold)."""
    return ops.drop(columns=[c for c in LABEL_COLUMNS if c in ops.columns])


class SchemaError(ValueError):
    """Input does not follow the canonical CommOps schema.

    The message names the source (file), the column or parameter, the first offending row (as a
    file line where the reader knows it) and value, and what was expected. The same facts are
    available as attributes for programmatic use; ``row`` stays the 0-based data row even when
    the message says ``line``.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        column: str | None = None,
        row: int | None = None,
        value: object = None,
        expected: str | None = None,
        parameter: str | None = None,
        line: int | None = None,
    ) -> None:
        # numpy scalars would print as np.int64(-1) / np.float64(nan): show the plain value.
        if isinstance(value, np.generic):
            value = value.item()
        display = value
        if isinstance(value, str) and len(value) > 200:
            # a field of megabytes (a corrupt file) would bury the message
            display = value[:200] + f"... ({len(value)} characters)"
        elif isinstance(value, int) and value.bit_length() > 133:
            # hundreds of digits would too, and over 4,300 cannot even be printed
            display = shown(value)
        self.message = message
        self.source = source
        self.column = column
        self.row = row
        self.value = value
        self.expected = expected
        self.parameter = parameter
        self.line = line
        where = []
        if source:
            where.append(str(source))
        if parameter:
            where.append(parameter)
        if column:
            where.append(f"column {column!r}")
        if line is not None:
            where.append(f"line {line}")
        elif row is not None:
            where.append(f"row {row}")
        prefix = ", ".join(where) + ": " if where else ""
        detail = ""
        if value is not None:
            detail += f" (got {display!r}"
            detail += f"; expected {expected})" if expected else ")"
        elif expected:
            detail += f" (expected {expected})"
        super().__init__(f"{prefix}{message}{detail}")

    def at(self, *, source: str | None = None, line: int | None = None) -> SchemaError:
        """The same error located at another ``source`` and/or file ``line`` (rows unchanged)."""
        return type(self)(
            self.message, source=source or self.source, column=self.column, row=self.row,
            value=self.value, expected=self.expected, parameter=self.parameter,
            line=line if line is not None else self.line,
        )


@dataclass(frozen=True)
class ValidationOptions:
    """Knobs of :func:`validate`.

    Parameters
    ----------
    check_groups:
        Check that all participants of a group list the same members (``group_ranks``), each
        of them among those members, and the same ``group_kind``; and that a rank has one
        ``host``.
    allow_negative_duration:
        Accept negative durations (clock glitches); by default they are an error.
    """

    check_groups: bool = True
    allow_negative_duration: bool = False


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _text(col: pd.Series, column: str, source: str | None) -> pd.Series:
    """``col`` as ``str``, a missing value as ``""``; a list, object or bytes in it (JSON,
    Arrow list/struct/binary columns) is a :class:`SchemaError`, not its printed form.

    A categorical column (what Parquet dictionary columns read back as) is converted through
    its categories, once each, rather than row by row; ``fillna("")`` would refuse it anyway
    when ``""`` is not one of its categories.

    ``group_ranks`` comes back categorical, one category per distinct member list: a
    communicator of every rank of an 8,192-GPU job lists 40 kB on each of its rows, which a
    string column would copy row by row (13 GB for 327 k operators).
    """
    if col.dtype == object:
        odd = np.fromiter((isinstance(v, (list, tuple, dict, set, np.ndarray, bytes, bytearray))
                           for v in col), bool, len(col))
        if odd.any():
            i = _first_bad(odd)
            raise SchemaError("not a string", source=source, column=column, row=i,
                              value=type(col.iloc[i]).__name__, expected="a string")
    if column == "group_ranks":
        if isinstance(col.dtype, pd.CategoricalDtype):
            codes = col.cat.codes.to_numpy()
            lists = [str(c) for c in col.cat.categories]
        else:
            # factorized as it is: made text first, a 40 kB list would be copied on every row
            codes, uniq = pd.factorize(col, sort=False)
            lists = [str(c) for c in uniq]
        if "" not in lists:
            lists.append("")
        codes = np.where(codes < 0, lists.index(""), codes)
        cats = pd.Index(lists, dtype=object)
        if not cats.is_unique:  # two categories that read the same once made text
            codes, cats = pd.factorize(cats.take(codes))
        return pd.Series(pd.Categorical.from_codes(codes, categories=cats), index=col.index)
    if not isinstance(col.dtype, pd.CategoricalDtype):
        if col.dtype.kind in "fiub":  # (an empty CSV column reads as floats: NaN)
            col = col.astype(object)  # "" is no float: pandas refuses to fill it in soon
        return col.fillna("").astype(str)
    cats = col.cat.categories.astype(str)
    codes = col.cat.codes.to_numpy()
    missing = codes < 0
    if missing.any():
        codes = np.where(missing, len(cats), codes)
        cats = cats.append(pd.Index([""], dtype=cats.dtype))
    return pd.Series(cats.take(codes), index=col.index)


#: Columns that may come as Arrow/pandas time types, and the unit they are converted to:
#: a timestamp (any unit or time zone) for the start, a duration for the times.
_TIME_UNITS: dict[str, tuple[str, int]] = {
    "start_ns": ("M", 1),  # ns since the epoch
    "duration_us": ("m", 1000),  # ns -> microseconds
    "step_compute_us": ("m", 1000),
}


def _from_time_type(col: pd.Series, column: str, source: str | None) -> pd.Series:
    """A timestamp or duration column (a Parquet ``timestamp``/``duration`` type, any unit)
    as the plain number the schema's column holds: read as its raw integer it would be off by
    its unit (seconds taken for nanoseconds); anything else is returned as it is."""
    dtype = col.dtype
    got = "M" if isinstance(dtype, pd.DatetimeTZDtype) else getattr(dtype, "kind", "")
    if got not in ("M", "m"):
        return col
    what = "a timestamp" if got == "M" else "a duration"
    want, per_unit = _TIME_UNITS.get(column, ("", 0))
    if got != want:
        expected = {"M": "a timestamp or an integer of ns since the epoch",
                    "m": "a duration or a number of microseconds"}.get(want, "a number")
        raise SchemaError(f"{what}, not a number", source=source, column=column, row=0,
                          value=str(dtype), expected=expected)
    if got == "M" and isinstance(dtype, pd.DatetimeTZDtype):
        col = col.dt.tz_convert("UTC").dt.tz_localize(None)
    missing = col.isna().to_numpy()
    if missing.any():
        i = _first_bad(missing)
        raise SchemaError("missing value", source=source, column=column, row=i, value=None,
                          expected=f"{what} on every row")
    try:
        ns = col.astype("datetime64[ns]" if got == "M" else "timedelta64[ns]")
    except (OverflowError, ValueError) as exc:  # beyond 64-bit ns (about the years 1677-2262)
        raise SchemaError(f"{what} out of range ({exc})", source=source, column=column,
                          value=str(dtype), expected=f"{what} within 64-bit nanoseconds"
                          ) from None
    raw = ns.to_numpy().view(np.int64)
    if per_unit == 1:
        return pd.Series(raw, index=col.index)
    return pd.Series(raw / per_unit, index=col.index)


def _coerce(df: pd.DataFrame, column: str, kind: str, source: str | None) -> pd.Series:
    col = df[column]
    if kind != "str":
        col = _from_time_type(col, column, source)
    if kind == "str":
        if col.isna().any():
            i = _first_bad(col.isna().to_numpy())
            raise SchemaError(
                "missing value", source=source, column=column, row=i, value=None,
                expected="a non-empty string",
            )
        return _text(col, column, source)
    flags = _booleans(col)
    if flags.any():
        # true/false would read as 1/0: a column of flags in the place of a number
        i = _first_bad(flags)
        raise SchemaError("a boolean, not a number", source=source, column=column, row=i,
                          value=col.iloc[i], expected=f"a finite {kind}")
    try:
        numeric = pd.to_numeric(col, errors="coerce")
    except (OverflowError, TypeError, ValueError):
        # Python ints beyond 64 bits (JSON allows any) in an object column
        huge = np.fromiter((isinstance(v, int) and abs(v) >= 1 << 63 for v in col), bool,
                           len(col))
        if huge.any():
            i = _first_bad(huge)
            raise SchemaError("out of range", source=source, column=column, row=i,
                              value=shown(col.iloc[i]),
                              expected="a number within 64 bits (|x| < 2**63)") from None
        numeric = pd.Series([_number(v) for v in col], index=col.index, dtype=np.float64)
    bad = numeric.isna().to_numpy() | ~np.isfinite(numeric.to_numpy(dtype=float, na_value=np.nan))
    if bad.any():
        i = _first_bad(bad)
        if pd.api.types.is_scalar(col.iloc[i]) and pd.isna(col.iloc[i]):
            # nothing there (a JSON line without the key, an empty CSV field; readers give
            # these as NaN, as they do a written 'nan'): no value to show
            raise SchemaError(
                "missing value (or NaN)", source=source, column=column, row=i, value=None,
                expected="the peer's rank on every send and recv" if column == "peer"
                else f"a finite {kind} on every row")
        raise SchemaError(
            "not a number", source=source, column=column, row=i, value=shown(col.iloc[i]),
            expected=f"a finite {kind}",
        )
    if kind == "int":
        if numeric.dtype.kind in "iu":
            # int64 as it is; a uint64 column may hold values beyond int64
            huge = numeric.to_numpy() > np.iinfo(np.int64).max if numeric.dtype.kind == "u" \
                else np.zeros(len(numeric), bool)
        else:
            values = numeric.to_numpy(dtype=float)
            frac = values != np.round(values)
            if frac.any():
                i = _first_bad(frac)
                raise SchemaError(
                    "not an integer", source=source, column=column, row=i, value=col.iloc[i],
                    expected="an integer",
                )
            huge = np.abs(values) >= 2.0 ** 63
        if huge.any():
            # astype would wrap it around to a negative number
            i = _first_bad(huge)
            raise SchemaError(
                "out of range", source=source, column=column, row=i, value=shown(col.iloc[i]),
                expected="an integer within 64 bits (|x| < 2**63)",
            )
        return numeric.astype(np.int64)
    return numeric.astype(np.float64)


def _booleans(col: pd.Series) -> np.ndarray:
    """Which values of ``col`` are booleans (a bool column, or bools in an object column)."""
    if col.dtype == bool or isinstance(col.dtype, pd.BooleanDtype):
        return np.ones(len(col), bool)
    if col.dtype == object:
        return np.fromiter((isinstance(v, (bool, np.bool_)) for v in col), bool, len(col))
    return np.zeros(len(col), bool)


def _number(value: object) -> float:
    """``value`` as a float; NaN when it is none (or too large for one)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return np.nan


#: Integer columns of the schema that are never negative.
_COUNTS = ("iteration", "rank", "seq", "nbytes", "start_ns")


def is_canonical(df: pd.DataFrame) -> bool:
    """Whether ``df`` already has the schema's types and values in range in its required
    columns (as :func:`validate` leaves a table: what :func:`holmes_ml.io.read_ops` and the
    simulator give), judged in a few vectorized passes; the cross-row checks of
    :func:`validate` (a communicator's members, a rank's host) are not made again."""
    if any(c not in df.columns for c in REQUIRED_COLUMNS):
        return False
    for c in _COUNTS:
        dtype = df[c].dtype
        if not (isinstance(dtype, np.dtype) and dtype.kind in "iu"):
            return False
        if len(df) and df[c].min() < 0:
            return False
    dtype = df["duration_us"].dtype
    if not (isinstance(dtype, np.dtype) and dtype.kind in "iuf"):
        return False
    d = df["duration_us"].to_numpy(dtype=np.float64)
    if not (np.isfinite(d).all() and (d >= 0).all()):
        return False
    op = df["op"]
    names = op.cat.categories if isinstance(op.dtype, pd.CategoricalDtype) else pd.unique(op)
    return set(map(str, names)) <= set(OP_TYPES) and not op.isna().any()


def checked(df: pd.DataFrame, what: str = "ops") -> pd.DataFrame:
    """``df`` itself when :func:`is_canonical`, else :func:`validate` of it (a
    :class:`SchemaError` naming ``what``, the column, row and value when a value breaks the
    schema: a fractional rank, a negative or missing duration, an unknown op). What the
    library's entry points taking a table run first, so a table built by hand gets the
    errors a file would."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what}: got {type(df).__name__}; expected a pandas DataFrame of "
                        "CommOps rows (holmes_ml.io.read_ops gives one)")
    return df if is_canonical(df) else validate(df, source=what)


def validate(
    df: pd.DataFrame,
    source: str | None = None,
    options: ValidationOptions | None = None,
) -> pd.DataFrame:
    """Check and coerce a table to the canonical CommOps schema.

    Parameters
    ----------
    df:
        Candidate table, one row per operator per rank.
    source:
        Name of the file (or stream) the table came from, used in error messages.
    options:
        See :class:`ValidationOptions`.

    Returns
    -------
    pandas.DataFrame
        A new table with required columns first, canonical dtypes (``int64``, ``float64``,
        ``str``), ``op`` values lower-cased, and ``peer`` filled with -1 where absent. A
        ``start_ns`` of a timestamp type (a Parquet ``timestamp`` of any unit or time zone)
        becomes ns since the epoch, a ``duration_us`` or ``step_compute_us`` of a duration
        type microseconds; a time type in any other column is an error.

    Raises
    ------
    SchemaError
        Missing column, wrong type, unknown op, negative size/duration/start time, an op
        whose end does not fit in 64-bit ns, a group whose
        participants disagree on its members or kind, a rank outside its group's members, or
        a rank logged on two hosts.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"iteration": [0], "rank": [0], "op": ["all_reduce"], "group": ["dp-0"],
    ...                   "seq": [0], "nbytes": [1024], "start_ns": [0], "duration_us": [12.5]})
    >>> validate(t).dtypes["duration_us"]
    dtype('float64')
    """
    opts = options or ValidationOptions()
    if not isinstance(df, pd.DataFrame):
        raise SchemaError(
            "not a table", source=source, value=type(df).__name__, expected="a pandas DataFrame"
        )
    if isinstance(df.columns, pd.MultiIndex):
        raise SchemaError("columns with several levels", source=source,
                          value=str(df.columns[0]), expected="one name per column")
    twice = df.columns[df.columns.duplicated()]
    if len(twice):
        raise SchemaError("column named twice", source=source, column=str(twice[0]),
                          expected="each column once")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing and len(df.columns) == 1:
        # one column whose name holds the others: a CSV of another separator
        name = str(df.columns[0])
        sep = next((c for c in (";", "\t", "|") if c in name and any(
            req in name.split(c) for req in REQUIRED_COLUMNS)), None)
        if sep is not None:
            raise SchemaError(
                f"one column, {shown(name)!r}: the fields are separated by {sep!r}",
                source=source, expected="a CSV separated by commas (e.g. pandas: "
                "pd.read_csv(path, sep=" + repr(sep) + ").to_csv(path, index=False))")
    if missing:
        raise SchemaError(
            f"missing required column(s) {', '.join(missing)}",
            source=source,
            column=missing[0],
            expected="columns " + ", ".join(REQUIRED_COLUMNS),
        )
    df = df.reset_index(drop=True)
    if "peer" in df.columns and df["peer"].isna().any():
        # a collective has no peer: a row leaving it out (a JSON line without the key, an
        # empty CSV field) means -1, as the column left out does; a send/recv needs one
        p2p = df["op"].astype(str).str.strip().str.lower().isin(P2P_OPS)
        df = df.assign(peer=df["peer"].where(p2p | df["peer"].notna(), -1))
    out: dict[str, pd.Series] = {}
    for column, kind in {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}.items():
        if column in df.columns:
            if column in OPTIONAL_COLUMNS and column != "peer" and kind == "str":
                out[column] = _text(df[column], column, source)
            else:
                out[column] = _coerce(df, column, kind, source)

    op = out["op"].str.strip().str.lower()
    known = op.isin(OP_TYPES).to_numpy()
    if not known.all():
        i = _first_bad(~known)
        raise SchemaError(
            "unknown op type", source=source, column="op", row=i, value=df["op"].iloc[i],
            expected="one of " + ", ".join(OP_TYPES),
        )
    out["op"] = op
    for column in ("nbytes", "seq", "rank", "iteration", "start_ns"):
        neg = (out[column] < 0).to_numpy()
        if neg.any():
            i = _first_bad(neg)
            raise SchemaError(
                "negative value", source=source, column=column, row=i, value=out[column].iloc[i],
                expected="a time >= 0 (ns since the epoch)" if column == "start_ns"
                else "a value >= 0",
            )
    if "step_compute_us" in out:
        neg = (out["step_compute_us"] < 0).to_numpy()
        if neg.any():
            i = _first_bad(neg)
            raise SchemaError(
                "negative compute time", source=source, column="step_compute_us", row=i,
                value=out["step_compute_us"].iloc[i],
                expected="the rank's compute time in the step, >= 0 microseconds")
    if not opts.allow_negative_duration:
        neg = (out["duration_us"] < 0).to_numpy()
        if neg.any():
            i = _first_bad(neg)
            raise SchemaError(
                "negative duration", source=source, column="duration_us", row=i,
                value=out["duration_us"].iloc[i], expected="a duration >= 0 microseconds",
            )
    # Each op's end must be a 64-bit ns time like its start (the features and the verdict
    # work in ns): a duration of 1e30 us would overflow there, not be refused here.
    room_us = (float(2**63 - 1) - out["start_ns"].to_numpy(dtype=np.float64)) / 1e3
    late = out["duration_us"].to_numpy() >= room_us
    if late.any():
        i = _first_bad(late)
        raise SchemaError(
            "duration too large", source=source, column="duration_us", row=i,
            value=float(out["duration_us"].iloc[i]),
            expected="an end within 64-bit ns (start_ns + 1000 x duration_us < 2**63: at "
            f"most {room_us[i]:.6g} us at this start)")
    empty_group = (out["group"].str.len() == 0).to_numpy()
    if empty_group.any():
        i = _first_bad(empty_group)
        raise SchemaError(
            "empty group name", source=source, column="group", row=i, value="",
            expected="a communicator name such as 'dp-0'",
        )
    if "peer" not in out:
        out["peer"] = pd.Series(np.full(len(df), -1, dtype=np.int64))
    peer = out["peer"].to_numpy()
    odd = (peer < -1) | (peer == out["rank"].to_numpy())
    if odd.any():
        i = _first_bad(odd)
        raise SchemaError(
            "a send/recv with itself" if peer[i] >= 0 else "negative value", source=source,
            column="peer", row=i, value=int(peer[i]),
            expected="the global rank at the other end, another than the row's rank (-1: "
            "none, a collective)",
        )

    result = pd.DataFrame(out)
    extras = [c for c in df.columns if c not in result.columns]
    for c in extras:
        result[c] = df[c].to_numpy()

    if opts.check_groups and len(result):
        _check_agreement(result, source)
    return result


def concat_ops(frames: list[pd.DataFrame], one_chunk: bool = False) -> pd.DataFrame:
    """``pd.concat`` of CommOps tables that keeps ``group_ranks`` categorical when every
    table has it so: pandas makes an object column of categoricals whose categories differ
    (two files that list different communicators), whose 40 kB member lists would then be
    hashed row by row. ``one_chunk``: each Arrow text column in one chunk, where pandas
    chains the tables' chunks (8,192 for a job's rank logs, which every later group-by and
    factorize would walk); not by default: an agent joins what it holds at every poll, and
    copying it all each time made its polls slower as its logs grew."""
    out = pd.concat(frames, ignore_index=True)
    lists = [f["group_ranks"] for f in frames if "group_ranks" in f.columns]
    if (len(frames) > 1 and len(lists) == len(frames)
            and all(isinstance(c.dtype, pd.CategoricalDtype) for c in lists)
            and not isinstance(out["group_ranks"].dtype, pd.CategoricalDtype)):
        # one dtype of categories, as union_categoricals asks
        lists = [c.cat.rename_categories(c.cat.categories.astype(object)) for c in lists]
        joined = union_categoricals(lists, ignore_order=True)
        # object categories, as validate makes them (the union infers str)
        out["group_ranks"] = joined.rename_categories(pd.Index(joined.categories, dtype=object))
    if one_chunk:
        for c in out.columns:
            if isinstance(out[c].array, pd.arrays.ArrowStringArray):
                chunks = out[c].array.__arrow_array__()
                if chunks.num_chunks > 1:
                    out[c] = pd.array(chunks.combine_chunks(), dtype=out[c].dtype)
    return out


def concat_validated(frames: list[pd.DataFrame], source: str | None = None) -> pd.DataFrame:
    """Tables each as :func:`validate` gave it, joined as ``validate(concat_ops(frames))``
    would join them, but that only what rows of different tables may say against each other
    is checked again (a communicator's members and kind, a rank's host, a collective's op):
    each row's own values were checked with its table. Tables of different columns are
    validated again whole (a column one of them lacked is missing values in the join).

    Raises
    ------
    SchemaError
        As :func:`validate`, naming the row of the joined table.
    """
    out = concat_ops(frames, one_chunk=True)
    if any(list(f.columns) != list(frames[0].columns) for f in frames[1:]):
        return validate(out, source=source)
    if len(out):
        _check_agreement(out, source)
    return out


def member_ranks(group_ranks: object) -> tuple[int, ...]:
    """A ``group_ranks`` value (space-separated global ranks, in group order) as ints; empty
    for an empty list. Validated tables hold only such lists (:func:`validate`).

    >>> member_ranks("8 0 9"), member_ranks("")
    ((8, 0, 9), ())
    """
    return tuple(int(t) for t in str(group_ranks).split())


def members_key(group_ranks: str) -> str:
    """A member list as its distinct ranks in increasing order: the one spelling of a set
    (``"1 00 1"`` -> ``"0 1"``) by which lists are compared.

    >>> members_key("8 0 08")
    '0 8'
    """
    return " ".join(map(str, sorted(set(member_ranks(group_ranks)))))


def facts_of(ops: pd.DataFrame) -> dict[str, dict[str, str]]:
    """What a validated table says of each rank and communicator: per :data:`FACTS` column it
    has, owner -> value as text (members as :func:`members_key`, so that one set written two
    ways is one value); empty values left out.

    Examples
    --------
    >>> t = pd.DataFrame({"rank": [0, 1], "group": ["dp-0", "dp-0"], "host": ["a", "b"],
    ...                   "group_ranks": ["1 0", "1 0"]})
    >>> facts_of(t)
    {'host': {'0': 'a', '1': 'b'}, 'group_ranks': {'dp-0': '0 1'}}
    """
    return facts_by_part(ops, np.zeros(len(ops), dtype=np.int64), 1)[0]


def facts_by_part(ops: pd.DataFrame, part: np.ndarray, n: int
                  ) -> list[dict[str, dict[str, str]]]:
    """:func:`facts_of` of each of the ``n`` parts of a validated table (``part``: the part
    of each row, e.g. the file it came from), in one pass over it; a part holding none of a
    fact the table has gets it empty."""
    out: list[dict[str, dict[str, str]]] = [{} for _ in range(n)]
    for fact, (owner, _) in FACTS.items():
        if fact not in ops.columns:
            continue
        # (a categorical member list is compared by its code, not its 40 kB of text)
        pairs = ops[[owner, fact]].assign(_part=part).drop_duplicates()
        values = pairs[fact].astype(str)
        keep = (values.str.len() > 0).to_numpy()
        for k in range(n):
            out[k][fact] = {}
        for k, key, value in zip(pairs["_part"][keep], pairs[owner][keep].astype(str),
                                 values[keep], strict=True):
            out[k][fact][key] = members_key(value) if fact == "group_ranks" else value
    return out


def _check_agreement(df: pd.DataFrame, source: str | None) -> None:
    """Facts that every row of a group or of a rank must agree on, and the copies of one
    collective instance on its op.

    Downstream keeps one value per group (its members and kind) and per rank (its host): a
    second spelling further down would be dropped without a word and the verdict would name
    the wrong ranks or host. The first row that contradicts an earlier one is reported.
    """
    group = pd.factorize(df["group"])[0]
    rank = df["rank"].to_numpy()
    _check_instances(df, group, source)
    if "group_ranks" in df.columns:
        _check_groups(df, group, source)
    for column, owner, what in (("host", rank, "host"), ("group_kind", group, "kind")):
        if column in df.columns:
            _check_one_value(df, owner, source, column, what)
    if "job" in df.columns:
        _check_one_job(df, source)


def job_of(ops: pd.DataFrame) -> tuple[int, str] | None:
    """``(row, name)`` of the first row of a table that names its job; None when none does
    (no ``job`` column, or only empty names).

    >>> job_of(pd.DataFrame({"job": ["", "pretrain", "pretrain"]}))
    (1, 'pretrain')
    """
    if "job" not in ops.columns:
        return None
    known = (ops["job"].astype(str).str.len() > 0).to_numpy()
    if not known.any():
        return None
    row = _first_bad(known)
    return row, str(ops["job"].iat[row])


def _check_one_job(df: pd.DataFrame, source: str | None) -> None:
    """One non-empty ``job`` name in the table: the logs of two jobs read together would be
    compared operator by operator as if they were one job's ranks."""
    found = job_of(df)
    if found is None:
        return
    first, names = found[0], df["job"]
    known = (names.str.len() > 0).to_numpy()
    other = known & (names != names.iat[first]).to_numpy()
    if other.any():
        row = _first_bad(other)
        raise SchemaError(
            "logs of a second job", source=source, column="job", row=row,
            value=str(names.iat[row]),
            expected=f"one job per input: {str(names.iat[first])!r} as in row {first}; read "
            "each job's logs on their own")


def _codes(*columns: np.ndarray) -> np.ndarray:
    """One int64 per row, equal for two rows exactly when all the row-aligned ``columns`` are
    (integer columns spanning less than 2**31 are offset, not hashed; the code is re-densified
    before it could overflow)."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    span = 1
    for column in columns:
        c = np.asarray(column)
        lo = int(c.min()) if c.dtype.kind in "iu" and len(c) else 0
        if c.dtype.kind in "iu" and len(c) and int(c.max()) - lo < 1 << 31:
            width = int(c.max()) - lo + 1
            c = c.astype(np.int64) - lo
        else:
            c, uniques = pd.factorize(c)
            width = max(len(uniques), 1)
        if span * width >= 1 << 62:
            code = pd.factorize(code)[0].astype(np.int64)
            span = int(code.max()) + 1
        code = code * width + c
        span *= width
    return code


def _first_rows(*columns: np.ndarray) -> np.ndarray:
    """Positions of the first row of each distinct combination of ``columns``, in row order."""
    return np.flatnonzero(~pd.Series(_codes(*columns)).duplicated().to_numpy())


def _contradiction(owner: np.ndarray, value: np.ndarray) -> tuple[int, int] | None:
    """``(row, earlier)``: the first row whose ``value`` differs from the one an earlier row
    gave the same ``owner``, and the first row of that owner (positions); None if none."""
    first = _first_rows(owner, value)
    owners = owner[first]
    again = pd.Series(owners).duplicated().to_numpy()
    if not again.any():
        return None
    i = _first_bad(again)
    return int(first[i]), int(first[_first_bad(owners == owners[i])])


def _check_instances(df: pd.DataFrame, group: np.ndarray, source: str | None) -> None:
    """The copies of one collective instance (iteration, group, seq) name the same op.

    Every member of a communicator runs its collectives in the same order, so a copy naming
    another op means the logs do not line up (a rank whose sequence numbers restarted, or
    logs of two jobs): its peers would be compared with another operation's.
    """
    coll = np.flatnonzero((~df["op"].isin(P2P_OPS)).to_numpy())
    if not len(coll):
        return
    instance = _codes(df["iteration"].to_numpy()[coll], group[coll], df["seq"].to_numpy()[coll])
    # factorized whole: a string column's Arrow codes are fast, its numpy objects are not
    found = _contradiction(instance, pd.factorize(df["op"])[0][coll])
    if found is None:
        return
    row, first = (int(coll[k]) for k in found)
    raise SchemaError(
        f"copies of collective {df.at[row, 'group']!r} seq {int(df.at[row, 'seq'])} "
        f"(iteration {int(df.at[row, 'iteration'])}) name two ops", source=source, column="op",
        row=row, value=str(df.at[row, "op"]),
        expected=f"{df.at[first, 'op']!r} as in row {first} (rank {int(df.at[first, 'rank'])}): "
        "every member runs a communicator's collectives in one order; a rank whose sequence "
        "numbers restarted?",
    )


@functools.lru_cache(maxsize=64)
def _member_list(text: str) -> tuple[frozenset[int] | None, str, int]:
    """The ranks of one ``group_ranks`` text (``None``: not a list of ranks), its
    :func:`members_key` and how many ranks it lists (more than it holds: one listed twice).
    Cached: the logs of one job, file after file, list the same communicators, and a list of
    8,192 ranks is 40 kB to parse."""
    tokens = text.split()
    # more than 19 digits is beyond int64 (and int() refuses over 4,300)
    if tokens and not all(t.isascii() and t.isdigit() and len(t) <= 19 for t in tokens):
        return None, "", len(tokens)
    return frozenset(int(t) for t in tokens), members_key(text), len(tokens)


def _check_groups(df: pd.DataFrame, group: np.ndarray, source: str | None) -> None:
    """Participants of a group list the same members, each of them among those members, and
    a send/recv's peer too."""
    listed = np.flatnonzero((df["group_ranks"].str.len() > 0).to_numpy())
    if not len(listed):
        return
    codes, lists = pd.factorize(df["group_ranks"])
    mcode = codes[listed]
    parsed = [_member_list(str(t)) for t in lists]
    for k, (members_of_k, _, listed_of_k) in enumerate(parsed):
        if members_of_k is None:
            raise SchemaError(
                "not a list of ranks", source=source, column="group_ranks",
                row=int(listed[_first_bad(mcode == k)]), value=str(lists[k]),
                expected="global ranks (integers >= 0) separated by spaces",
            )
        if len(members_of_k) != listed_of_k:  # (a communicator's members are distinct ranks)
            seen: set[int] = set()
            twice = -1
            for r in map(int, str(lists[k]).split()):  # (the error path only)
                if r in seen:
                    twice = r
                    break
                seen.add(r)
            text = str(lists[k])
            raise SchemaError(
                f"lists rank {twice} twice", source=source, column="group_ranks",
                row=int(listed[_first_bad(mcode == k)]),
                value=text if len(text) <= 80 else text[:77] + "...",
                expected="each member of the communicator once",
            )
    members = [m or frozenset() for m, _, _ in parsed]
    same = pd.factorize(np.array([key for _, key, _ in parsed], dtype=object))[0]
    found = _contradiction(group[listed], same[mcode])
    if found is not None:
        row, first = (int(listed[k]) for k in found)
        g, now, was = str(df.at[row, "group"]), str(df.at[row, "group_ranks"]), \
            str(df.at[first, "group_ranks"])
        if len(now.split()) != len(was.split()):
            raise SchemaError(
                f"participants of group {g!r} disagree on its size", source=source,
                column="group_ranks", row=row, value=f"{len(now.split())} ranks",
                expected=f"{len(was.split())} ranks as in row {first}",
            )
        raise SchemaError(
            f"participants of group {g!r} disagree on its members", source=source,
            column="group_ranks", row=row, value=now,
            expected=f"the members {was!r} as in row {first}",
        )
    checks = [("rank", "rank {q} is not a member of its group {g!r}",
               "the group's global ranks, {q} among them")]
    if "peer" in df.columns:
        checks.append(("peer", "peer {q} is not a member of the group {g!r}",
                       "one of its members {m!r}"))
    for column, message, expected in checks:
        who = df[column].to_numpy()[listed]
        heads = _first_rows(mcode, who)
        away = np.array([q >= 0 and int(q) not in members[k]
                         for q, k in zip(who[heads], mcode[heads], strict=True)], dtype=bool)
        if away.any():
            i = _first_bad(away)
            row, q = int(listed[heads[i]]), int(who[heads[i]])
            g, m = str(df.at[row, "group"]), str(df.at[row, "group_ranks"])
            raise SchemaError(
                message.format(q=q, g=g), source=source, column=column if column == "peer"
                else "group_ranks", row=row, value=q if column == "peer" else m,
                expected=expected.format(q=q, m=m),
            )


def _check_one_value(
    df: pd.DataFrame, owner: np.ndarray, source: str | None, column: str, what: str
) -> None:
    """One non-empty ``column`` value per owner (a rank's host, a group's kind)."""
    known = np.flatnonzero((df[column].str.len() > 0).to_numpy())
    if not len(known):
        return
    found = _contradiction(owner[known], pd.factorize(df[column])[0][known])
    if found is None:
        return
    row, first = (int(known[k]) for k in found)
    label = FACTS[column][0]  # the owner column: rank or group
    o = df.at[row, label]
    raise SchemaError(
        f"{label} {o if label == 'rank' else repr(str(o))} logged with two {what}s",
        source=source, column=column, row=row, value=str(df.at[row, column]),
        expected=f"one {what} per {label}: {str(df.at[first, column])!r} as in row {first}"
        + ("; a restart that moved ranks to other hosts starts a new run, to be read on its own"
           if label == "rank" else ""),
    )
