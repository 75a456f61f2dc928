"""The canonical CommOps schema: coercion and errors that name the file, column, row and value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.io.schema import (
    OP_TYPES,
    REQUIRED_COLUMNS,
    SchemaError,
    ValidationOptions,
    concat_ops,
    concat_validated,
    validate,
)


def _table(**overrides) -> pd.DataFrame:
    base = {
        "iteration": [0, 0, 0, 0],
        "rank": [0, 1, 0, 1],
        "op": ["all_reduce", "all_reduce", "send", "recv"],
        "group": ["dp-0", "dp-0", "pp-0-1", "pp-0-1"],
        "seq": [0, 0, 0, 0],
        "nbytes": [1024, 1024, 64, 64],
        "start_ns": [10, 12, 20, 21],
        "duration_us": [5.0, 3.5, 1.0, 2.0],
    }
    base.update(overrides)
    return pd.DataFrame(base)


def test_valid_table_is_coerced_to_canonical_dtypes():
    out = validate(_table(nbytes=["1024", "1024", "64", "64"], op=[" All_Reduce", "all_reduce", "SEND", "recv"]))
    assert list(out.columns[: len(REQUIRED_COLUMNS)]) == list(REQUIRED_COLUMNS)
    assert out["nbytes"].dtype == "int64"
    assert out["duration_us"].dtype == "float64"
    assert out["op"].tolist() == ["all_reduce", "all_reduce", "send", "recv"]
    assert (out["peer"] == -1).all()


def test_categorical_columns_read_as_their_text():
    """Parquet dictionary columns come back categorical: they validate to the same table as
    plain text, a missing optional value as "" (categoricals refuse fillna with a new
    value), a missing required one as an error naming the row."""
    plain = _table(host=["h0", None, "h0", "h1"], group_kind=["dp", "dp", "pp", "pp"])
    cat = plain.astype({"op": "category", "group": "category", "host": "category",
                        "group_kind": "category"})
    out = validate(cat)
    pd.testing.assert_frame_equal(out, validate(plain))
    assert out["host"].tolist() == ["h0", "", "h0", "h1"]
    cat.loc[2, "group"] = None
    with pytest.raises(SchemaError, match="missing value") as e:
        validate(cat)
    assert (e.value.column, e.value.row) == ("group", 2)


def test_member_lists_are_kept_once_per_communicator():
    """A communicator of every rank of a large job lists all of them on each of its rows; the
    canonical table keeps each distinct list once (categorical), whether it came as text or as
    a Parquet dictionary column, with a missing list as ""."""
    world = " ".join(map(str, range(8192)))  # about 40 kB
    n = 2000
    plain = pd.DataFrame({
        "iteration": np.repeat(np.arange(n // 4), 4), "rank": np.tile([0, 1, 2, 3], n // 4),
        "op": "all_reduce", "group": "world", "seq": np.repeat(np.arange(n // 4), 4),
        "nbytes": 8, "start_ns": np.arange(n), "duration_us": 1.0,
        "group_ranks": [world] * (n - 1) + [None]})
    for table in (plain, plain.astype({"group_ranks": "category"})):
        out = validate(table, options=ValidationOptions(check_groups=False))
        ranks = out["group_ranks"]
        assert isinstance(ranks.dtype, pd.CategoricalDtype)
        assert sorted(ranks.cat.categories) == ["", world]
        assert ranks.iloc[0] == world and ranks.iloc[-1] == ""
        # one copy of the list, not one a row (n x 40 kB = 80 MB)
        assert ranks.memory_usage(deep=True) < 2 * len(world) + 16 * n


@pytest.mark.parametrize("value", [["dp-0"], {"name": "dp-0"}, b"dp-0"])
def test_a_list_object_or_bytes_is_not_a_name(value):
    """JSON lists/objects and Arrow list/struct/binary columns: refused, not printed."""
    t = _table(group=pd.Series(["dp-0", value, "pp-0-1", "pp-0-1"], dtype=object))
    with pytest.raises(SchemaError, match="not a string") as e:
        validate(t)
    assert (e.value.column, e.value.row, e.value.value) == ("group", 1, type(value).__name__)


def test_a_start_before_the_epoch_is_refused():
    """start_ns is ns since the epoch: every converter keeps it >= 0, and so must a native log
    (a negative one is a clock that was never set, or an overflow)."""
    with pytest.raises(SchemaError, match=r"column 'start_ns', row 1: negative value \(got -3; "
                       r"expected a time >= 0 \(ns since the epoch\)\)"):
        validate(_table(start_ns=[10, -3, 20, 21]))


def test_logs_of_two_jobs_are_refused():
    """Two jobs read together would be compared as if their ranks were one job's."""
    with pytest.raises(SchemaError, match=r"column 'job', row 2: logs of a second job "
                       r"\(got 'b'; expected one job per input: 'a' as in row 1"):
        validate(_table(job=["", "a", "b", "a"]))
    assert validate(_table(job=["a", "a", "", "a"]))["job"].tolist() == ["a", "a", "", "a"]


def test_extra_columns_are_kept():
    out = validate(_table(abnormal=[True, False, False, False]))
    assert out["abnormal"].tolist() == [True, False, False, False]


@pytest.mark.parametrize("column", list(REQUIRED_COLUMNS))
def test_missing_column_is_named(column):
    with pytest.raises(SchemaError, match=column) as err:
        validate(_table().drop(columns=[column]), source="ranks/rank-3.csv")
    assert "ranks/rank-3.csv" in str(err.value)
    assert err.value.column == column


def test_unknown_op_names_row_value_and_choices():
    with pytest.raises(SchemaError) as err:
        validate(_table(op=["all_reduce", "allreduce_coalesced", "send", "recv"]), source="f.parquet")
    msg = str(err.value)
    assert "f.parquet" in msg and "'op'" in msg and "row 1" in msg and "allreduce_coalesced" in msg
    assert all(op in msg for op in OP_TYPES)


def test_wrong_type_names_value():
    with pytest.raises(SchemaError, match=r"duration_us.*row 2.*'fast'"):
        validate(_table(duration_us=[1.0, 2.0, "fast", 3.0]))


def test_an_error_shows_a_number_of_thousands_of_digits_by_its_size():
    """str() of an int of over 4,300 digits raises; the error must still say what it got."""
    for value, shown in ((10**5000, "an integer of about 5001 digits"),
                         (np.int64(-3), "-3"), (10**60, "1" + "0" * 23 + "... (61 digits)")):
        message = str(SchemaError("out of range", source="ops.jsonl", column="nbytes",
                                  value=value, expected="an integer within 64 bits"))
        assert f"(got {shown!r}" in message or f"(got {shown}" in message, message


def test_fractional_integer_is_refused():
    with pytest.raises(SchemaError, match=r"seq.*row 3.*1\.5"):
        validate(_table(seq=[0, 0, 1, 1.5]))


def test_negative_duration_is_refused_unless_allowed():
    from holmes_ml.io.schema import ValidationOptions

    bad = _table(duration_us=[1.0, -2.0, 1.0, 1.0])
    with pytest.raises(SchemaError, match="negative duration"):
        validate(bad)
    assert validate(bad, options=ValidationOptions(allow_negative_duration=True))["duration_us"].min() == -2.0


def test_step_compute_time_is_a_number_and_not_negative():
    ok = validate(_table(step_compute_us=["900", 800, 900.5, 800]))
    assert ok["step_compute_us"].dtype == np.float64
    with pytest.raises(SchemaError, match=r"step_compute_us.*row 2.*'slow'"):
        validate(_table(step_compute_us=[900, 800, "slow", 800]), source="job.csv")
    with pytest.raises(SchemaError, match=r"step_compute_us.*row 1: negative compute time"):
        validate(_table(step_compute_us=[900, -1, 900, 800]))


def test_group_size_disagreement_is_reported():
    t = _table(group_ranks=["0 1", "0 1 2", "0 1", "0 1"])
    with pytest.raises(SchemaError, match=r"row 1.*dp-0.*disagree.*3 ranks.*2 ranks"):
        validate(t, source="job.csv")


def test_not_a_dataframe():
    with pytest.raises(SchemaError, match="DataFrame"):
        validate([1, 2, 3])  # type: ignore[arg-type]


# Rows that contradict earlier ones: downstream keeps one value per group and per rank, so the
# second spelling would be dropped without a word. The base table: dp-0 over ranks 0 and 1,
# and a send (rank 0) / recv (rank 1) in pp-0-1.
CONTRADICTIONS = {
    "members": (dict(rank=[0, 1, 0, 2], group_ranks=["0 1", "1 3", "0 2", "0 2"]),
                r"column 'group_ranks', row 1: participants of group 'dp-0' disagree on its "
                r"members \(got '1 3'; expected the members '0 1' as in row 0\)"),
    "rank outside": (dict(rank=[0, 1, 0, 1], group_ranks=["0 1", "0 1", "0 2", "0 2"]),
                     r"column 'group_ranks', row 3: rank 1 is not a member of its group "
                     r"'pp-0-1' \(got '0 2'; "
                     r"expected the group's global ranks, 1 among them"),
    "two hosts": (dict(host=["node-a", "node-b", "node-b", "node-b"]),
                  r"column 'host', row 2: rank 0 logged with two hosts \(got 'node-b'; "
                  r"expected one host per rank: 'node-a' as in row 0; a restart that moved "
                  r"ranks to other hosts starts a new run"),
    "two kinds": (dict(group_kind=["dp", "tp", "pp", "pp"]),
                  r"column 'group_kind', row 1: group 'dp-0' logged with two kinds \(got "
                  r"'tp'; expected one kind per group: 'dp' as in row 0"),
    "not ranks": (dict(group_ranks=["0 1", "0 1", "0 1", "0 \u00b2"]),
                  r"column 'group_ranks', row 3: not a list of ranks \(got '0 \u00b2'; "
                  r"expected global ranks \(integers >= 0\) separated by spaces\)"),
    "peer itself": (dict(peer=[-1, -1, 0, 0]),
                    r"column 'peer', row 2: a send/recv with itself \(got 0; expected the "
                    r"global rank at the other end"),
    "peer negative": (dict(peer=[-3, -1, 1, 0]),
                      r"column 'peer', row 0: negative value \(got -3"),
    "peer outside": (dict(peer=[-1, -1, 1, 5], group_ranks=["0 1"] * 4),
                     r"column 'peer', row 3: peer 5 is not a member of the group 'pp-0-1' "
                     r"\(got 5; expected one of its members '0 1'\)"),
    "two ops": (dict(op=["all_reduce", "all_gather", "send", "recv"]),
                r"column 'op', row 1: copies of collective 'dp-0' seq 0 \(iteration 0\) name "
                r"two ops \(got 'all_gather'; expected 'all_reduce' as in row 0 \(rank 0\)"),
}


@pytest.mark.parametrize("case", list(CONTRADICTIONS))
def test_rows_that_contradict_earlier_ones_are_reported(case):
    overrides, message = CONTRADICTIONS[case]
    with pytest.raises(SchemaError, match="job\\.csv, " + message):
        validate(_table(**overrides), source="job.csv")


@pytest.mark.parametrize("overrides", [
    dict(rank=[0, 1, 0, 2], group_ranks=["0 1", "1 0", "0 2", "0 2"]),  # members in any order
    dict(group_ranks=["0 1", "00 1", "0 1", "1 0"]),  # ranks written another way
    dict(host=["node-a", "node-b", None, "node-b"]),  # a row without a host says nothing
    dict(peer=[-1, -1, 1, 0], group_ranks=["0 1"] * 4),
    # the same seq in another iteration is another instance (logs that number per iteration)
    dict(op=["all_reduce", "all_gather", "send", "recv"], iteration=[0, 1, 0, 0]),
], ids=["member order", "rank spelling", "missing host", "peers", "seq per iteration"])
def test_rows_that_only_look_different_are_accepted(overrides):
    assert len(validate(_table(**overrides))) == 4


def test_codes_tell_combinations_apart_at_any_magnitude():
    from holmes_ml.io.schema import _codes

    rng = np.random.default_rng(0)
    big = rng.integers(0, 1 << 62, 50)
    cols = [np.repeat(big, 4), np.tile(np.array([0, 1 << 40, 5, 5]), 50),
            np.array(list("abab") * 50, dtype=object), rng.integers(0, 3, 200)]
    code = _codes(*cols)
    keys = list(zip(*cols, strict=True))
    same = code[:, None] == code[None, :]
    expect = np.array([[a == b for b in keys] for a in keys])
    assert (same == expect).all()


def test_files_listing_different_communicators_read_to_one_categorical_column(tmp_path):
    from holmes_ml.io import read_ops

    world = " ".join(map(str, range(4)))

    def part(ranks: list[int], lists: list[str]) -> pd.DataFrame:
        return pd.DataFrame({
            "iteration": 0, "rank": ranks, "op": "all_reduce",
            "group": ["world" if g == world else "pair" for g in lists], "seq": 0,
            "nbytes": 8, "start_ns": 1, "duration_us": 1.0, "group_ranks": lists})

    # one file lists the world communicator alone, the other also a pair of ranks
    part([0, 1], [world, world]).astype({"group_ranks": "category"}).to_parquet(
        tmp_path / "a.parquet")
    both = pd.concat([part([2, 3], [world, world]), part([2, 3], ["2 3", "2 3"])])
    both.assign(seq=[0, 0, 1, 1]).astype({"group_ranks": "category"}).to_parquet(
        tmp_path / "b.parquet")
    ops = read_ops(tmp_path)
    assert isinstance(ops["group_ranks"].dtype, pd.CategoricalDtype)
    assert sorted(set(ops["group_ranks"])) == sorted(["2 3", world])
    assert ops.groupby("group")["rank"].nunique().to_dict() == {"pair": 2, "world": 4}
    # joined without making objects of them on the way (pandas alone would)
    a, b = (validate(pd.read_parquet(tmp_path / f)) for f in ("a.parquet", "b.parquet"))
    assert pd.concat([a, b])["group_ranks"].dtype == object
    joined = concat_ops([a, b])
    assert isinstance(joined["group_ranks"].dtype, pd.CategoricalDtype)
    assert joined["group_ranks"].tolist() == [*a["group_ranks"], *b["group_ranks"]]


def test_validated_tables_join_as_validating_the_join_gives():
    """concat_validated checks again only what rows of different tables say against each
    other, and gives what validate of the join gives: categories and all."""
    members = {"dp-0": "0 1", "pp-0-1": "0 1"}
    a = validate(_table(group_ranks=[members[g] for g in _table()["group"]]))
    b = validate(_table(iteration=[1] * 4, group=["tp-0"] * 4, op=["all_gather"] * 4,
                        seq=[0, 0, 1, 1], group_ranks=["1 0"] * 4))
    b_other = validate(_table(iteration=[1] * 4, group_ranks=["0 1 2"] * 4))
    joined = concat_validated([a, b], source="x")
    whole = validate(concat_ops([a, b]), source="x")
    assert joined.equals(whole) and list(joined.dtypes) == list(whole.dtypes)
    assert joined["group_ranks"].cat.categories.equals(whole["group_ranks"].cat.categories)
    # each text column in one piece, not one Arrow chunk per table joined
    assert all(joined[c].array.__arrow_array__().num_chunks == 1 for c in ("op", "group"))
    # dp-0 listed with other members in the second table: the row of the join is named
    with pytest.raises(SchemaError, match="participants of group 'dp-0' disagree") as err:
        concat_validated([a, b_other], source="x")
    assert err.value.row == 4
    # a table without a column the other has: validated again whole, as the join is
    hosts = validate(_table(host=["h0", "h1", "h0", "h1"]))
    mixed = concat_validated([hosts, validate(_table(iteration=[1] * 4))], source="x")
    assert mixed.equals(validate(concat_ops([hosts, validate(_table(iteration=[1] * 4))])))
    assert mixed["host"].tolist() == ["h0", "h1", "h0", "h1", "", "", "", ""]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_time_typed_columns_convert_by_their_unit(tmp_path, unit):
    """A Parquet timestamp/duration column is not read as its raw integer (seconds taken for
    nanoseconds): the start becomes ns since the epoch, the duration microseconds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from holmes_ml.io import read_ops

    start_ns = np.array([1_767_225_600_018_423_924, 1_767_225_600_018_424_924, 0, 5_000])
    per = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[unit]
    table = pa.Table.from_pandas(_table(), preserve_index=False)
    zone = "UTC" if unit == "ms" else None  # a time zone does not shift the instant
    table = table.set_column(table.schema.get_field_index("start_ns"), "start_ns",
                             pa.array(start_ns // per).cast(pa.timestamp(unit, tz=zone)))
    dur_us = np.array([5_000.0, 3_000_000.0, 0.0, 1.0])
    table = table.set_column(table.schema.get_field_index("duration_us"), "duration_us",
                             pa.array((dur_us * 1000).astype(np.int64) // per)
                             .cast(pa.duration(unit)))
    path = tmp_path / "timed.parquet"
    pq.write_table(table, path)
    out = read_ops(path)
    assert out["start_ns"].tolist() == (start_ns // per * per).tolist()
    assert out["duration_us"].tolist() == ((dur_us * 1000).astype(np.int64) // per * per
                                           / 1000).tolist()


@pytest.mark.parametrize("column, value, message", [
    ("iteration", pd.to_timedelta([1, 2, 3, 4], unit="s"), "a duration, not a number"),
    ("duration_us", pd.to_datetime([1, 2, 3, 4]), "a timestamp, not a number"),
    ("start_ns", pd.to_timedelta([1, 2, 3, 4], unit="s"), "a duration, not a number"),
    ("start_ns", pd.to_datetime([1, None, 3, 4]), "missing value"),
])
def test_time_type_where_none_belongs_is_refused(column, value, message):
    with pytest.raises(SchemaError, match=message) as info:
        validate(_table(**{column: value}), source="x.parquet")
    assert info.value.column == column and "x.parquet" in str(info.value)


def test_duration_whose_end_overflows_64_bit_ns_is_refused():
    with pytest.raises(SchemaError, match="duration too large") as info:
        validate(_table(duration_us=[5.0, 3.5, 1e30, 2.0]))
    assert info.value.column == "duration_us" and info.value.row == 2
    # the largest that fits still reads
    room = (2**63 - 1 - 21) / 1e3
    assert validate(_table(duration_us=[5.0, 3.5, 1.0, room * 0.999]))["duration_us"].iloc[3] > 0
