"""Native CSV/Parquet/JSONL readers, format detection and bad-input messages."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from holmes_ml.io import FORMATS, SchemaError, detect_format, read_ops


def _ops(n_ranks: int = 4, iters: int = 3, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for it in range(iters):
        for r in range(n_ranks):
            rows.append({"iteration": it, "rank": r, "op": "all_reduce", "group": "dp-0",
                         "seq": it, "nbytes": 1 << 20, "start_ns": 10**18 + it * 10**9 + r,
                         "duration_us": float(rng.uniform(100, 200)),
                         "group_ranks": " ".join(map(str, range(n_ranks)))})
    return pd.DataFrame(rows)


def _write_per_rank(df: pd.DataFrame, d, kinds=("csv", "csv.gz", "jsonl", "parquet")):
    d.mkdir()
    for i, (r, sub) in enumerate(df.groupby("rank")):
        kind = kinds[i % len(kinds)]
        p = d / f"rank-{r}.{kind}"
        if kind == "csv":
            sub.to_csv(p, index=False)
        elif kind == "csv.gz":
            sub.to_csv(p, index=False, compression="gzip")
        elif kind == "jsonl":
            sub.to_json(p, orient="records", lines=True)
        elif kind == "jsonl.gz":
            p.write_bytes(gzip.compress(sub.to_json(orient="records", lines=True).encode()))
        elif kind == "plain.parquet":  # as the logger writes them: no pandas metadata
            table = pa.Table.from_pandas(sub, preserve_index=False)
            pq.write_table(table.replace_schema_metadata(None), p)
        else:
            sub.to_parquet(p)
    return d


@pytest.mark.parametrize("kind", ["csv", "csv.gz", "jsonl", "jsonl.gz", "parquet"])
def test_single_file_roundtrip(tmp_path, kind):
    df = _ops()
    d = _write_per_rank(df, tmp_path / "d", kinds=(kind,))
    f = next(iter(sorted(d.iterdir())))
    assert detect_format(f) == "native"
    out = read_ops(f)
    assert set(out["rank"]) == {0}
    exp = df[df["rank"] == 0].reset_index(drop=True)
    np.testing.assert_allclose(out["duration_us"], exp["duration_us"])
    assert out["start_ns"].dtype == np.int64 and (out["start_ns"] == exp["start_ns"]).all()
    assert (out["peer"] == -1).all()


def test_directory_of_mixed_per_rank_files(tmp_path):
    df = _ops(n_ranks=8)
    d = _write_per_rank(df, tmp_path / "d")
    out = read_ops(d)
    assert len(out) == len(df)
    merged = out.merge(df, on=["rank", "seq"], suffixes=("", "_exp"))
    np.testing.assert_allclose(merged["duration_us"], merged["duration_us_exp"])
    assert sorted(out["rank"].unique()) == list(range(8))


@pytest.mark.parametrize("kinds", [("csv", "csv.gz", "jsonl", "parquet"),
                                   ("plain.parquet", "plain.parquet", "csv", "plain.parquet")])
@pytest.mark.parametrize("at_once", [256, 3])
@pytest.mark.parametrize("peer_in_one_file", [False, True])
def test_a_directory_reads_as_its_files_read_one_by_one(tmp_path, monkeypatch,
                                                        peer_in_one_file, at_once, kinds):
    # The files are validated together, one check instead of one per file (a peer column in
    # one file only leaves the others' collectives without one: -1, as when no file has it):
    # what comes out is what validating each file and then the whole gives.
    from holmes_ml.io import readers
    from holmes_ml.io.schema import concat_ops, validate

    df = _ops(n_ranks=8)
    df["host"] = [f"h{r // 4}" for r in df["rank"]]
    d = _write_per_rank(df, tmp_path / "d", kinds=kinds)
    if peer_in_one_file:
        f = next(d.glob("rank-3.*"))
        pq.write_table(pq.read_table(f).append_column("peer", pa.array([-1] * 3)), f)
    files = sorted(d.iterdir())
    one_by_one = validate(concat_ops([readers._read_native(f) for f in files]))
    each = []
    monkeypatch.setattr(readers, "_read_native", lambda f, t=None: each.append(f) or
                        validate(t, source=str(f)))
    monkeypatch.setattr(readers, "_FILES_AT_ONCE", at_once)  # read and checked 3 at a time
    out = read_ops(d)
    assert out.equals(one_by_one) and list(out.dtypes) == list(one_by_one.dtypes)
    assert each == []  # no file needed a check of its own


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_member_lists_are_held_once_each_while_files_are_read(tmp_path, kind):
    # an 8,192-rank member list is 40 kB on every row of its communicator: held as text in
    # every file until all are read, a directory of per-rank logs would take gigabytes
    from holmes_ml.io.readers import _read_unvalidated

    d = _write_per_rank(_ops(n_ranks=2), tmp_path / "d", kinds=(kind,))
    table = _read_unvalidated(d / f"rank-0.{kind}")
    assert isinstance(table["group_ranks"].dtype, pd.CategoricalDtype)
    assert list(table["group_ranks"].cat.categories) == ["0 1"]


@pytest.mark.parametrize("at_once", [256, 3])
@pytest.mark.parametrize("kinds", [("csv",), ("jsonl", "csv", "parquet")])
def test_a_bad_file_among_many_is_named_as_when_read_alone(tmp_path, monkeypatch, kinds,
                                                          at_once):
    from holmes_ml.io import readers

    monkeypatch.setattr(readers, "_FILES_AT_ONCE", at_once)
    df = _ops(n_ranks=6).astype({"duration_us": object})
    df.loc[(df["rank"] == 4) & (df["iteration"] == 1), "duration_us"] = "slow"
    d = _write_per_rank(df, tmp_path / "d", kinds=kinds)
    bad = next(f for f in d.iterdir() if f.name.startswith("rank-4."))
    with pytest.raises(SchemaError) as alone:
        read_ops(bad)
    with pytest.raises(SchemaError) as among:
        read_ops(d)
    assert str(among.value) == str(alone.value) and among.value.line == alone.value.line
    assert bad.name in str(among.value) and "'slow'" in str(among.value)
    # a column missing from one file is named with that file, not as values missing
    d2 = _write_per_rank(_ops(n_ranks=6), tmp_path / "d2", kinds=kinds)
    f = next(f for f in d2.iterdir() if f.name.startswith("rank-2."))
    if f.suffix == ".parquet":
        pd.read_parquet(f).drop(columns="nbytes").to_parquet(f)
    elif f.suffix == ".csv":
        pd.read_csv(f).drop(columns="nbytes").to_csv(f, index=False)
    else:
        pd.read_json(f, lines=True).drop(columns="nbytes").to_json(f, orient="records",
                                                                     lines=True)
    with pytest.raises(SchemaError, match=r"rank-2\..*missing required column\(s\) nbytes"):
        read_ops(d2)


def test_tar_archive_of_per_rank_files(tmp_path):
    import tarfile

    df = _ops(n_ranks=8)
    d = _write_per_rank(df, tmp_path / "d")
    arc = tmp_path / "logs.tar.gz"
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(d, arcname="job/logs")
    out = read_ops(arc)
    pd.testing.assert_frame_equal(
        out.sort_values(["rank", "seq"]).reset_index(drop=True),
        read_ops(d).sort_values(["rank", "seq"]).reset_index(drop=True),
    )


def test_broken_archive_names_file(tmp_path):
    arc = tmp_path / "logs.tar.gz"
    arc.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(SchemaError, match="logs.tar.gz.*cannot unpack archive|"
                       "cannot unpack archive.*logs.tar.gz"):
        read_ops(arc)


def test_unknown_format_argument(tmp_path):
    d = _write_per_rank(_ops(), tmp_path / "d", kinds=("csv",))
    with pytest.raises(SchemaError, match="format"):
        read_ops(d, format="nope")
    assert "native" in FORMATS


def test_missing_column_names_file_and_column(tmp_path):
    p = tmp_path / "rank-0.csv"
    _ops().drop(columns="nbytes").to_csv(p, index=False)
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "rank-0.csv" in str(err.value) and "nbytes" in str(err.value)


def test_unknown_op_names_value_and_row(tmp_path):
    df = _ops()
    df.loc[5, "op"] = "allfoo"
    p = tmp_path / "x.jsonl"
    df.to_json(p, orient="records", lines=True)
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    msg = str(err.value)
    assert "x.jsonl" in msg and "'op'" in msg and "allfoo" in msg and "line 6" in msg
    assert err.value.row == 5  # the data row stays available to programs


def test_wrong_type_names_value(tmp_path):
    df = _ops().astype({"duration_us": object})
    df.loc[2, "duration_us"] = "slow"
    p = tmp_path / "bad.csv"
    df.to_csv(p, index=False)
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "bad.csv" in str(err.value) and "duration_us" in str(err.value)
    assert "slow" in str(err.value)


def test_mismatched_group_size(tmp_path):
    df = _ops()
    df.loc[df["rank"] == 3, "group_ranks"] = "0 1 2"
    d = _write_per_rank(df, tmp_path / "d", kinds=("csv",))
    with pytest.raises(SchemaError) as err:
        read_ops(d)
    assert "group_ranks" in str(err.value) and "dp-0" in str(err.value)


def test_truncated_jsonl_reads_its_whole_lines_and_names_the_cut_one(tmp_path, caplog):
    """Cut mid-record (a live log, a crashed writer): the whole lines are read, and the cut
    one is named in a warning (a malformed line that has its end is refused:
    tests/test_readers_bad_input.py)."""
    import logging

    p = tmp_path / "t.jsonl"
    text = _ops().to_json(orient="records", lines=True)
    cut = text.index("\n", len(text) // 2) - 10  # in the middle of a record
    p.write_text(text[:cut])
    with caplog.at_level(logging.WARNING):
        got = read_ops(p)
    nth = text[:cut].count("\n") + 1
    assert len(got) == nth - 1
    assert "t.jsonl" in caplog.text and f"line {nth}: no end of line" in caplog.text


def test_mixed_formats_rejected(tmp_path):
    d = _write_per_rank(_ops(), tmp_path / "d", kinds=("csv",))
    (d / "trace.json").write_text(json.dumps({"traceEvents": [], "distributedInfo": {"rank": 9}}))
    with pytest.raises(SchemaError, match="different formats"):
        read_ops(d)


def test_missing_path(tmp_path):
    with pytest.raises(SchemaError, match="not found"):
        read_ops(tmp_path / "nothing.csv")


def test_unrecognised_content(tmp_path):
    p = tmp_path / "notes.bin"
    p.write_bytes(b"\x00\x01hello")
    with pytest.raises(SchemaError) as err:
        detect_format(p)
    assert "notes.bin" in str(err.value) and "format" in str(err.value)


def test_a_progress_bar_follows_the_files_when_asked(tmp_path, monkeypatch):
    from holmes_ml.io import _common

    shown = []

    def each_file(paths):
        shown.append((_common._PROGRESS.get(), len(paths)))
        return paths

    monkeypatch.setattr("holmes_ml.io.readers.each_file", each_file)
    d = _write_per_rank(_ops(n_ranks=4), tmp_path / "d")
    quiet = read_ops(d)
    assert read_ops(d, progress=True).equals(quiet)
    assert shown == [(False, 4), (True, 4)]
    assert not _common._PROGRESS.get()  # only while read_ops runs
    with _common.showing_progress(True):
        bar = _common.each_file([1, 2])
        assert list(bar) == [1, 2] and hasattr(bar, "close")  # a tqdm
        assert _common.each_file([1]) == [1]  # one file: no bar
    assert _common.each_file([1, 2]) == [1, 2]


@pytest.mark.parametrize("indent", [None, 1])
def test_a_json_array_of_records_reads_like_json_lines(tmp_path, indent):
    # pandas' to_json(orient="records") writes one array; pretty-printed it spans many lines
    df = _ops()
    lines, array = tmp_path / "ops.jsonl", tmp_path / "ops.json"
    df.to_json(lines, orient="records", lines=True)
    array.write_text(json.dumps(json.loads(df.to_json(orient="records")), indent=indent))
    assert detect_format(array) == "native"
    pd.testing.assert_frame_equal(read_ops(array), read_ops(lines))


def test_a_json_array_s_bad_records_are_named_by_index(tmp_path):
    records = json.loads(_ops().to_json(orient="records"))
    p = tmp_path / "ops.json"
    p.write_text(json.dumps(records[:3] + [[1, 2]] + records[3:], indent=1))
    with pytest.raises(SchemaError, match=r"records\[3\]: not a JSON object"):
        read_ops(p)
    records[5]["duration_us"] = -1.0
    p.write_text(json.dumps(records, indent=1))
    with pytest.raises(SchemaError, match=r"row 5: negative duration") as err:
        read_ops(p)
    assert err.value.line is None  # pretty-printed: row 5 is not line 6
    for r in records:
        del r["seq"]
    p.write_text(json.dumps(records))
    with pytest.raises(SchemaError, match=r"missing required column\(s\) seq"):
        read_ops(p, format="native")
    p.write_text("[]")
    with pytest.raises(SchemaError, match="an empty JSON array"):
        read_ops(p, format="native")


def test_another_table_exported_as_a_json_array_beside_the_logs_is_skipped(tmp_path, caplog):
    # scores or a summary saved with to_json(orient="records") next to the logs is no log
    df = _ops()
    d = tmp_path / "logs"
    d.mkdir()
    df.to_json(d / "ops.jsonl", orient="records", lines=True)
    df[["iteration", "rank", "op", "group", "duration_us"]].assign(score=0.9).to_json(
        d / "abnormal.json", orient="records")
    with caplog.at_level("WARNING"):
        out = read_ops(d)
    assert len(out) == len(df)
    assert "abnormal.json" in caplog.text


def test_a_json_array_named_as_json_lines_is_read_in_a_directory(tmp_path, caplog):
    # to_json(orient="records") into a .jsonl name: one array, not one object per line
    df = _ops()
    d = tmp_path / "logs"
    d.mkdir()
    (d / "ops.jsonl").write_text(json.dumps(json.loads(df.to_json(orient="records")), indent=1))
    # an exported table of something else, so named too, is still no log
    df[["iteration", "rank", "duration_us"]].assign(score=0.9).to_json(
        d / "scores.jsonl", orient="records")
    with caplog.at_level("WARNING"):
        out = read_ops(d)
    pd.testing.assert_frame_equal(out.reset_index(drop=True), read_ops(d / "ops.jsonl"))
    assert "scores.jsonl" in caplog.text and "ops.jsonl" not in caplog.text


def _lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def _as_python_reads(data: bytes) -> pd.DataFrame:
    return pd.DataFrame.from_records([json.loads(line) for line in data.splitlines()
                                      if line.strip()])


_ROW = {"iteration": 3, "rank": 1, "op": "all_reduce", "group": "dp-0", "seq": 7,
        "nbytes": 1 << 20, "start_ns": 10**18, "duration_us": 150.5, "group_ranks": "0 1 2 3"}


@pytest.mark.parametrize("case,fast", [
    ("logged", True),  # the logger's rows and optional columns
    ("extra fields", True),  # fields the schema does not know, kept as they come
    ("duration an integer", True),
    ("a null", False),
    ("a field missing on one line", False),
    ("an int as text", False),
    ("an int as a float", False),
    ("a date", False),  # pyarrow would make it a timestamp
    ("a list", False),
    ("a torn line", False),
    ("not UTF-8", False),  # pyarrow would take the bytes into a string, which breaks later
    ("UTF-8", True),
])
def test_json_lines_read_by_pyarrow_validate_as_python_s_json_reads_them(case, fast):
    from holmes_ml.io.readers import json_lines_frame

    rows = [dict(_ROW, rank=r, start_ns=10**18 + r, host=f"n{r // 2}", peer=-1,
                 group_kind="dp", job="") for r in range(4)]
    if case == "extra fields":
        for r in rows:
            r.update(stream=7, note="x", ok=True, lat=1.5)
    elif case == "duration an integer":
        rows[0]["duration_us"] = 150
    elif case == "a null":
        rows[1]["peer"] = None
    elif case == "a field missing on one line":
        del rows[2]["host"]
    elif case == "an int as text":
        rows[1]["seq"] = "7"
    elif case == "an int as a float":
        rows[1]["nbytes"] = 1.5
    elif case == "a date":
        for r in rows:
            r["when"] = "2026-12-04 10:00:00"
    elif case == "a list":
        rows[3]["tags"] = [1, 2]
    elif case == "UTF-8":
        rows[1]["host"] = "nœud-1"
    data = _lines(rows)
    if case == "not UTF-8":
        data = data.replace(b'"n0"', b'"n\xff"', 1)
    if case == "a torn line":
        data += b'{"iteration": 4, "rank": 0, "op": "all_re\n'
    got = json_lines_frame(data)
    assert (got is not None) == fast
    alone = json_lines_frame(data, threads=False)  # as a node agent reads (on one core)
    assert (alone is None) == (got is None)
    if got is not None:
        pd.testing.assert_frame_equal(alone, got)
        from holmes_ml.io.schema import validate

        want = validate(_as_python_reads(data))
        pd.testing.assert_frame_equal(validate(got)[want.columns], want)


def test_json_lines_read_by_pyarrow_keep_every_row_of_a_long_log(tmp_path):
    # more than one of pyarrow's blocks (1 MiB), read through read_ops as a file
    from holmes_ml.io.readers import json_lines_frame

    rows = [dict(_ROW, iteration=i // 4, rank=i % 4, seq=i // 4, start_ns=10**18 + i,
                 duration_us=100.0 + i % 97) for i in range(20_000)]
    data = _lines(rows)
    assert len(data) > 2 << 20
    assert len(json_lines_frame(data)) == len(rows)
    (tmp_path / "log.jsonl").write_bytes(data)
    got = read_ops([str(tmp_path / "log.jsonl")])
    assert len(got) == len(rows) and got["duration_us"].sum() == sum(r["duration_us"]
                                                                    for r in rows)
