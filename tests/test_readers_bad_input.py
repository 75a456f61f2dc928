"""Bad and messy input: every problem is one clear SchemaError naming file, field and value, or
a warning naming what was skipped or dropped; nothing is read twice and nothing is lost silently.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import tarfile

import numpy as np
import pandas as pd
import pytest
from test_readers_native import _ops

from holmes_ml.io import SchemaError, read_ops
from holmes_ml.io.bytedance import TRACE_COLUMNS, read_bytedance


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["rank", "seq"]).reset_index(drop=True)


# 1. Truncated files -------------------------------------------------------------------------

def test_truncated_parquet_auto_gives_the_native_error(tmp_path):
    whole = tmp_path / "whole.parquet"
    _ops().to_parquet(whole)
    cut = tmp_path / "trunc.parquet"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(SchemaError) as auto:
        read_ops(cut)
    with pytest.raises(SchemaError) as native:
        read_ops(cut, format="native")
    assert str(auto.value) == str(native.value)
    assert "trunc.parquet" in str(auto.value) and "Parquet" in str(auto.value)


def _open_parquet_logs(d, ops: pd.DataFrame, open_ranks: tuple[int, ...]):
    """Per-rank Parquet logs in ``d``; those of ``open_ranks`` still open, as a running job's
    logger leaves them (row groups written, no footer yet). Returns the open writers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir()
    writers = []
    for r, sub in ops.groupby("rank"):
        table = pa.Table.from_pandas(sub.reset_index(drop=True), preserve_index=False)
        w = pq.ParquetWriter(d / f"rank-{r}.parquet", table.schema)
        w.write_table(table)
        if r in open_ranks:
            writers.append(w)
        else:
            w.close()
    return writers


def test_parquet_log_still_being_written_is_skipped_naming_it(tmp_path, caplog):
    from holmes_ml.pipeline import analyze

    ops = _ops(n_ranks=4, iters=6)
    writers = _open_parquet_logs(tmp_path / "logs", ops, open_ranks=(2,))
    try:
        assert (tmp_path / "logs" / "rank-2.parquet").read_bytes()[:4] == b"PAR1"
        with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
            got = read_ops(tmp_path / "logs")
        # the other ranks' rows, every one of them
        assert sorted(got["rank"].unique()) == [0, 1, 3]
        assert len(got) == (ops["rank"] != 2).sum()
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "rank-2.parquet" in said and "without their footer" in said, said
        assert got.attrs["unread_files"] == [str(tmp_path / "logs" / "rank-2.parquet")]
        # the verdict says so too (a warning on stderr is lost to a script reading the JSON)
        note = analyze(got, model="rule").note or ""
        assert "1 Parquet log file(s) were not read" in note, note
        # and `holmes check` lists it among what localization can use
        from holmes_ml.io.inventory import inventory

        checks = [c["what"] for c in inventory(got)["checks"] if not c["ok"]]
        assert any("rank-2.parquet" in c and "without their footer" in c for c in checks)
    finally:
        for w in writers:
            w.close()
    # closed, it is read like the others
    assert len(read_ops(tmp_path / "logs")) == len(ops)


def test_parquet_logs_all_without_footer_are_refused_saying_why(tmp_path):
    ops = _ops(n_ranks=2, iters=3)
    writers = _open_parquet_logs(tmp_path / "logs", ops, open_ranks=(0, 1))
    try:
        with pytest.raises(SchemaError) as every:
            read_ops(tmp_path / "logs")
        with pytest.raises(SchemaError) as one:
            read_ops(tmp_path / "logs" / "rank-0.parquet")
    finally:
        for w in writers:
            w.close()
    assert "2 Parquet files, none with its footer" in str(every.value)
    msg = str(one.value)
    assert "rank-0.parquet" in msg and "without its footer" in msg and "fmt='arrow'" in msg
    # a file cut anywhere else (the footer there, a column chunk gone) is still unreadable
    whole = tmp_path / "whole.parquet"
    _ops().to_parquet(whole)
    data = whole.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[:4] + data[len(data) // 2:])
    with pytest.raises(SchemaError) as other:
        read_ops(cut)
    assert "cut.parquet" in str(other.value) and "without its footer" not in str(other.value)


def test_truncated_json_gz_says_gzip_is_corrupt(tmp_path):
    data = gzip.compress(_ops().to_json(orient="records", lines=True).encode())
    p = tmp_path / "ops.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    msg = str(err.value)
    assert "ops.json.gz" in msg and "truncated gzip" in msg and "cannot tell" not in msg


# 2. Hint of the auto-detection ----------------------------------------------------------------

def test_unknown_format_hint_names_cli_and_library_and_is_closed(tmp_path):
    p = tmp_path / "notes.bin"
    p.write_bytes(b"\x00\x01hello")
    with pytest.raises(SchemaError) as err:
        read_ops(p)  # a file named by the caller is never skipped
    msg = str(err.value)
    assert "--format" in msg and "format=" in msg and "pass format= explicitly" not in msg
    assert msg.count("(") == msg.count(")")


# 3. Stray files in a directory --------------------------------------------------------------

def _stray_dir(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    df = _ops()
    df.to_csv(d / "ops.csv", index=False)
    (d / "NOTES.txt").write_text("the run where rank 3 looked slow\n")
    (d / "notes.json").write_text(json.dumps({"who": "me", "why": "test", "a": 1, "b": 2,
                                              "c": 3, "d": 4, "e": 5, "f": 6}))
    (d / "other.log").write_text("some other program's log line\n")
    return d, df


def test_unidentified_files_in_a_directory_are_skipped_with_a_warning(tmp_path, caplog):
    d, df = _stray_dir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
        out = read_ops(d)
    pd.testing.assert_frame_equal(_sorted(out), _sorted(read_ops(d / "ops.csv")))
    for name in ("NOTES.txt", "notes.json", "other.log"):
        assert any(name in r.getMessage() and "skipped" in r.getMessage()
                   for r in caplog.records if r.levelno == logging.WARNING), name


def test_directory_without_any_log_lists_what_it_found(tmp_path):
    d, _ = _stray_dir(tmp_path)
    (d / "ops.csv").unlink()
    with pytest.raises(SchemaError) as err:
        read_ops(d)
    msg = str(err.value)
    assert "logs" in msg and "no file of a known format" in msg
    assert all(n in msg for n in ("NOTES.txt", "notes.json", "other.log"))


def test_malformed_log_in_a_directory_still_raises(tmp_path):
    d, df = _stray_dir(tmp_path)
    df.drop(columns="nbytes").to_csv(d / "rank-9.csv", index=False)  # a log, but broken
    with pytest.raises(SchemaError, match=r"rank-9\.csv.*nbytes"):
        read_ops(d)


@pytest.mark.parametrize("name", ["scores.iterations.csv", "metrics.jsonl"])
def test_a_table_that_is_not_a_log_is_skipped_among_logs(tmp_path, caplog, name):
    # e.g. `holmes detect` writes its iteration table beside the logs it read
    d, df = _stray_dir(tmp_path)
    other = pd.DataFrame({"iteration": [0, 1], "start_ns": [1, 2], "time_us": [3.0, 4.0]})
    if name.endswith(".csv"):
        other.to_csv(d / name, index=False)
    else:
        other.to_json(d / name, orient="records", lines=True)
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
        out = read_ops(d)
    pd.testing.assert_frame_equal(_sorted(out), _sorted(read_ops(d / "ops.csv")))
    assert any(name in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
    with pytest.raises(SchemaError, match="missing required column"):
        read_ops(d / name)  # named on its own, it is read (and refused) as a log


def test_named_unidentified_file_still_raises(tmp_path):
    d, _ = _stray_dir(tmp_path)
    with pytest.raises(SchemaError, match="NOTES.txt.*cannot tell the format"):
        read_ops([d / "ops.csv", d / "NOTES.txt"])


# 4. Logs in subdirectories --------------------------------------------------------------------

def test_logs_in_subdirectories_are_read_in_sorted_order(tmp_path):
    df = _ops(n_ranks=4)
    flat = tmp_path / "flat"
    flat.mkdir()
    nest = tmp_path / "nest"
    for r, sub in df.groupby("rank"):
        sub.to_csv(flat / f"rank-{r}.csv", index=False)
        (nest / f"node{r // 2}").mkdir(parents=True, exist_ok=True)
        sub.to_csv(nest / f"node{r // 2}" / f"rank-{r}.csv", index=False)
    (nest / ".hidden").mkdir()
    df.to_csv(nest / ".hidden" / "copy.csv", index=False)  # hidden trees are not logs
    out = read_ops(nest)
    pd.testing.assert_frame_equal(out, read_ops(flat))  # same rows, same order
    assert list(out["rank"].drop_duplicates()) == [0, 1, 2, 3]


def test_directory_with_only_companion_files_lists_them(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "README.md").write_text("readme")
    with pytest.raises(SchemaError) as err:
        read_ops(d)
    assert "no log files" in str(err.value) and "sub/README.md" in str(err.value)


# 5. Duplicates --------------------------------------------------------------------------------

def test_same_file_given_twice_is_read_once(tmp_path, caplog):
    d = tmp_path / "d"
    d.mkdir()
    _ops().to_parquet(d / "ops.parquet")
    once = read_ops(d)
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
        twice = read_ops([d, d / "ops.parquet", str(d / ".." / "d" / "ops.parquet")])
    pd.testing.assert_frame_equal(twice, once)
    said = [r.getMessage() for r in caplog.records if "given" in r.getMessage()]
    assert said == [f"{d / 'ops.parquet'} is given 3 times: read once"], said


def test_an_empty_log_says_empty(tmp_path):
    # a Parquet or JSON name got "cannot tell the format of this file" (and a JSON-lines hint
    # for a Parquet file read as native)
    for name, content in (("a.jsonl", ""), ("b.jsonl", "\n\n"), ("c.csv", ""),
                          ("d.parquet", ""), ("e.json", " \n"), ("f.json.gz", "")):
        (tmp_path / name).write_text(content)
        with pytest.raises(SchemaError, match=f"{name}: empty file"):
            read_ops(tmp_path / name)
    with pytest.raises(SchemaError, match="d.parquet: empty file \\(expected a Parquet table"):
        read_ops(tmp_path / "d.parquet", format="native")


def test_a_short_csv_line_is_named_with_its_field_count(tmp_path):
    p = tmp_path / "ops.csv"
    _ops().to_csv(p, index=False)
    lines = p.read_text().splitlines()
    lines[3] = ",".join(lines[3].split(",")[:5])  # a row short of fields inside the file
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    msg = str(err.value)
    assert "ops.csv, line 4: has 5 of the header's" in msg and "ends in the middle" not in msg


def test_a_csv_whose_last_line_is_still_being_written_is_read_without_it(tmp_path, caplog):
    """The last line cut mid-way, with no end yet (a live log, or one cut short): refused
    whole, while a JSON Lines log's unfinished last line was left out with a warning."""
    p = tmp_path / "ops.csv"
    ops = _ops()
    ops.to_csv(p, index=False)
    text = p.read_text()
    lines = text.splitlines()
    p.write_text(text[: len(text) - len(lines[-1]) - 1 + 12])
    with caplog.at_level(logging.WARNING):
        got = read_ops(p)
    assert len(got) == len(ops) - 1
    assert (f"ops.csv, line {len(lines)}: 3 of the header's {len(ops.columns)} fields and no "
            "end: a line still being written? Left out") in caplog.text, caplog.text
    p.write_text(text[: len(text) - 1])  # the last line whole, only its end missing: kept
    assert len(read_ops(p)) == len(ops)


def test_exact_duplicate_rows_are_dropped_with_a_count(tmp_path, caplog):
    df = _ops(seed=3)
    p = tmp_path / "ops.csv"
    pd.concat([df, df.iloc[[2, 5, 7]]], ignore_index=True).to_csv(p, index=False)
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
        out = read_ops(p)
    pd.testing.assert_frame_equal(out, read_ops(_write(df, tmp_path / "clean.csv")))
    assert "dropped 3 exact duplicate" in caplog.text and "ops.csv" in caplog.text


def test_a_copied_per_rank_file_counts_once(tmp_path, caplog):
    df = _ops()
    d = tmp_path / "d"
    d.mkdir()
    for r, sub in df.groupby("rank"):
        sub.to_csv(d / f"rank-{r}.csv", index=False)
    df[df["rank"] == 2].to_csv(d / "rank-2 (copy).csv", index=False)
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
        out = read_ops(d)
    assert len(out) == len(df)
    assert "dropped 3 exact duplicate" in caplog.text
    assert "rank-2 (copy).csv" in caplog.text and "rank-2.csv" in caplog.text


def test_rows_sharing_a_key_but_not_a_value_are_kept(tmp_path):
    df = _ops()
    again = df.iloc[[0]].assign(duration_us=df["duration_us"].iloc[0] + 1.0)
    p = _write(pd.concat([df, again], ignore_index=True), tmp_path / "ops.csv")
    assert len(read_ops(p)) == len(df) + 1


def _write(df, p):
    df.to_csv(p, index=False)
    return p


def test_two_runs_read_together_are_named(tmp_path, caplog):
    """Subdirectories are read too, so an earlier run's logs beside this one's would mix into
    every statistic: rows sharing an op's identity (rank, group, seq, op, iteration) are kept
    but the files are named."""
    (tmp_path / "logs" / "run1").mkdir(parents=True)
    (tmp_path / "logs" / "run2").mkdir()
    _write(_ops(seed=1), tmp_path / "logs" / "run1" / "ops.csv")
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
        read_ops(tmp_path / "logs")
    assert "share rank, group, seq, op and iteration" not in caplog.text
    _write(_ops(seed=2), tmp_path / "logs" / "run2" / "ops.csv")
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.readers"):
        ops = read_ops(tmp_path / "logs")
    assert len(ops) == 2 * len(_ops())
    assert "24 row(s) share rank, group, seq, op and iteration" in caplog.text
    assert "run1" in caplog.text and "run2" in caplog.text


def test_an_archive_inside_a_directory_reads_like_the_archive(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _write(_ops(), src / "ops.csv")
    (tmp_path / "data").mkdir()
    with tarfile.open(tmp_path / "data" / "traces.tar.gz", "w:gz") as tf:
        tf.add(src / "ops.csv", arcname="traces/ops.csv")
    (tmp_path / "data" / "README.md").write_text("where these come from")
    assert len(read_ops(tmp_path / "data")) == len(_ops())


# 6. The format parameter --------------------------------------------------------------------

def test_unknown_format_names_the_parameter(tmp_path):
    p = _write(_ops(), tmp_path / "ops.csv")
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="foo")
    msg = str(err.value)
    assert msg.startswith("format: ") and "'foo'" in msg and "one of auto, native" in msg
    assert "column" not in msg and err.value.parameter == "format" and err.value.column is None


# 7. Wrong explicit format ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt, kind, what", [
    ("kineto", "Parquet", "Kineto"),
    ("flight-recorder", "Parquet", "Flight Recorder"),
    ("nccl-inspector", "Parquet", "NCCL Inspector"),
])
def test_wrong_explicit_format_says_what_the_file_looks_like(tmp_path, caplog, fmt, kind,
                                                             what):
    p = tmp_path / "ops.parquet"
    _ops().to_parquet(p)
    with pytest.raises(SchemaError) as err, caplog.at_level(logging.WARNING):
        read_ops(p, format=fmt)
    msg = str(err.value)
    assert "ops.parquet" in msg and f"looks like {kind}" in msg and what in msg
    assert "malformed" not in msg
    assert "not UTF-8" not in caplog.text  # (its bytes are not decoded as text first)


@pytest.mark.parametrize("fmt", ["native", "nccl-inspector"])
@pytest.mark.parametrize("doc, kind", [
    ({"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "ncclKernel", "ts": 1}]},
     "Kineto"),
    ({"version": "2.4", "entries": []}, "Flight Recorder"),
    ({"ops": [{"a": 1}, {"a": 2}]}, "one JSON document spread over lines"),
])
def test_pretty_printed_json_read_as_lines_says_what_it_is(tmp_path, fmt, doc, kind):
    # a valid document over many lines is not "malformed JSON at line 2"
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc, indent=2))
    with pytest.raises(SchemaError) as err:
        read_ops(p, format=fmt)
    msg = str(err.value)
    assert "rank0.json" in msg and "not JSON Lines" in msg and kind in msg, msg
    assert "malformed" not in msg


def test_csv_read_as_bytedance_says_it_is_not_parquet(tmp_path):
    p = _write(_ops(), tmp_path / "ops.csv")
    with pytest.raises(SchemaError, match=r"ops\.csv.*not a Parquet file.*looks like CSV"):
        read_ops(p, format="bytedance")


# 8. Missing ByteDance meta file ---------------------------------------------------------------

def test_missing_bytedance_meta_says_the_file_does_not_exist(tmp_path):
    trace = tmp_path / "trace-X.parquet"
    pd.DataFrame({c: [0] for c in TRACE_COLUMNS} | {"optype": ["gc"]}).to_parquet(trace)
    with pytest.raises(SchemaError) as err:
        read_ops(trace)  # detected as a what-if trace by its columns
    msg = str(err.value)
    assert "meta-X.yaml does not exist" in msg and "dp_size" in msg and "got" not in msg
    (tmp_path / "meta-X.yaml").write_text("dp_size: 1\npp_size: 1\ntp_size: 1\n")
    # With the meta file found, the next problem is reported: no communication at all (this
    # used to end in a numpy ValueError from an empty array).
    with pytest.raises(SchemaError, match=r"trace-X\.parquet.*no communication op"):
        read_bytedance(trace)


# 9. Plain values in messages ------------------------------------------------------------------

def test_messages_show_plain_values_not_numpy_reprs(tmp_path):
    df = _ops()
    df.loc[3, "rank"] = -1
    p = tmp_path / "neg.parquet"
    df.to_parquet(p)
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "got -1;" in str(err.value) and "np." not in str(err.value)
    assert type(err.value.value) is int
    assert "got nan" in str(SchemaError("x", value=np.float64("nan")))


# 10. File lines instead of data rows ----------------------------------------------------------

def test_csv_error_names_the_file_line(tmp_path):
    df = _ops().astype({"duration_us": object})
    df.loc[3, "duration_us"] = "slow"
    text = df.to_csv(index=False).splitlines()
    # A blank line and one of spaces (pandas skips both) before the bad row shift its line by
    # two more.
    p = tmp_path / "bad.csv.gz"
    p.write_bytes(gzip.compress(("\n".join(text[:2] + ["", "  "] + text[2:]) + "\n").encode()))
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "bad.csv.gz" in str(err.value) and "line 7:" in str(err.value)
    assert "row" not in str(err.value) and err.value.row == 3 and err.value.line == 7
    assert "slow" in gzip.decompress(p.read_bytes()).decode().splitlines()[6]


def test_a_bad_value_beyond_the_first_parsing_chunk_is_named_without_a_pandas_warning(
        tmp_path, recwarn):
    # pandas parses a large CSV in chunks of 2**18 rows by default, typing each on its own:
    # a value past the first chunk gave a DtypeWarning and a column of mixed types.
    df = _ops(n_ranks=8, iters=2**18 // 8 + 2).astype({"duration_us": object})
    df.loc[len(df) - 1, "duration_us"] = "slow"
    p = tmp_path / "big.csv"
    df.to_csv(p, index=False)
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert err.value.line == len(df) + 1 and "'slow'" in str(err.value)
    assert not [w for w in recwarn if issubclass(w.category, pd.errors.DtypeWarning)]


def test_jsonl_error_names_the_file_line(tmp_path):
    df = _ops()
    df.loc[1, "op"] = "allfoo"
    p = tmp_path / "x.jsonl"
    p.write_text("\n" + df.to_json(orient="records", lines=True))  # leading blank line
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "line 3:" in str(err.value) and "row" not in str(err.value)
    assert "allfoo" in p.read_text().splitlines()[2]


def test_malformed_jsonl_says_line_once(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(_ops().iloc[:2].to_json(orient="records", lines=True) + '{"iteration": 0,\n')
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "line 3:" in str(err.value) and "row" not in str(err.value)


def test_parquet_errors_keep_rows(tmp_path):
    df = _ops()
    df.loc[4, "op"] = "allfoo"
    p = tmp_path / "x.parquet"
    df.to_parquet(p)
    with pytest.raises(SchemaError, match=r"row 4:"):
        read_ops(p)


# 11. Members of an archive ----------------------------------------------------------------------

def test_errors_inside_an_archive_name_archive_and_member(tmp_path):
    d = tmp_path / "src" / "dlrm_kineto"
    d.mkdir(parents=True)
    for r in range(2):
        (d / f"worker{r}_step.json").write_text(json.dumps(
            {"distributedInfo": {"rank": r}, "traceEvents": []}))
    (d / "worker1_step.json").write_text('{"traceEvents": [\n{"ph": "X",\n')  # cut short
    arc = tmp_path / "dlrm_kineto.tar.gz"
    with tarfile.open(arc, "w:gz") as tf:
        tf.add(d, arcname="dlrm_kineto")
    with pytest.raises(SchemaError) as err:
        read_ops(arc)
    msg = str(err.value)
    assert f"{arc}:dlrm_kineto/worker1_step.json" in msg and "holmes-read-" not in msg
    assert err.value.source == f"{arc}:dlrm_kineto/worker1_step.json"


def test_nccl_inspector_error_says_line_once(tmp_path):
    p = tmp_path / "h-pid1.log"
    p.write_text(json.dumps({"coll_perf": {"coll": "AllReduce"}}) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="nccl-inspector")
    msg = str(err.value)
    assert "line 1:" in msg and msg.count("line 1") == 1 and "row" not in msg


@pytest.mark.parametrize("at_once", [256, 2])
def test_files_that_disagree_name_both_files_and_lines(tmp_path, monkeypatch, at_once):
    """Each file is consistent alone; read together, rank 2's file lists other members for
    dp-0 than rank 0's did, and a later run put rank 1 on another host: the error names the
    file and line of the contradiction and of what it contradicts (files read two at a
    time too: the contradiction then lies between two parts, checked once all are read)."""
    from holmes_ml.io import readers

    monkeypatch.setattr(readers, "_FILES_AT_ONCE", at_once)
    df = _ops()
    d = tmp_path / "d"
    d.mkdir()
    for r, sub in df.groupby("rank"):
        if r == 2:
            sub = sub.assign(group_ranks="0 1 2 7")
        sub.to_csv(d / f"rank-{r}.csv", index=False)
    with pytest.raises(SchemaError) as err:
        read_ops(d)
    msg = str(err.value)
    assert "participants of group 'dp-0' disagree on its members at " in msg, msg
    assert f"{d / 'rank-2.csv'} line 2 (got '0 1 2 7'" in msg, msg
    assert f"as in {d / 'rank-0.csv'} line 2)" in msg, msg

    hosts = tmp_path / "hosts"
    hosts.mkdir()
    df.assign(host="node-a").to_csv(hosts / "run1.csv", index=False)
    moved = df.assign(host=np.where(df["rank"] == 1, "node-b", "node-a"),
                      iteration=df["iteration"] + 10)
    moved.to_parquet(hosts / "run2.parquet")
    with pytest.raises(SchemaError) as err:
        read_ops(hosts)
    msg = str(err.value)
    assert "rank 1 logged with two hosts at " in msg, msg
    assert f"{hosts / 'run2.parquet'} row 1 (got 'node-b'; expected one host per rank: " \
           f"'node-a' as in {hosts / 'run1.csv'} line 3; a restart that moved ranks" in msg, msg


# 9. Found by fuzzing the readers ------------------------------------------------------------

def _csv_text(tmp_path, name="ops.csv"):
    p = tmp_path / name
    _ops().to_csv(p, index=False)
    return p, p.read_text().splitlines()


def _corrupt_gzip(tmp_path):
    data = bytearray(gzip.compress(_ops().to_csv(index=False).encode() * 10))
    for i in range(200, 208):
        data[i] ^= 0x55  # inside the deflate stream: zlib.error, not OSError
    p = tmp_path / "ops.csv.gz"
    p.write_bytes(bytes(data))
    return p


def _jsonl(tmp_path, edit):
    rows = json.loads(_ops().to_json(orient="records"))
    edit(rows)
    p = tmp_path / "ops.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def _deep_json(tmp_path):
    p = tmp_path / "ops.jsonl"
    p.write_text('{"rank": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    return p


def _huge_int(rows):
    rows[1]["nbytes"] = 10 ** 400


def _bool_bytes(rows):
    rows[0]["nbytes"] = True


def _csv_edit(tmp_path, edit):
    p, lines = _csv_text(tmp_path)
    p.write_text("\n".join(edit(lines)) + "\n")
    return p


def _start_ns_2p70(lines):
    fields = lines[4].split(",")
    col = lines[0].split(",").index("start_ns")
    fields[col] = str(2 ** 70)
    return lines[:4] + [",".join(fields)] + lines[5:]


def _uint64_parquet(tmp_path):
    p = tmp_path / "ops.parquet"
    df = _ops()
    df["start_ns"] = df["start_ns"].astype(np.uint64)
    df.loc[3, "start_ns"] = np.uint64(2 ** 63 + 5)
    df.to_parquet(p)
    return p


def _two_level_columns(tmp_path):
    p = tmp_path / "ops.parquet"
    df = _ops()
    df.columns = pd.MultiIndex.from_arrays([df.columns, ["x"] * len(df.columns)])
    df.to_parquet(p)
    return p


def _hardlink_to_nothing(tmp_path):
    p = tmp_path / "logs.tar.gz"
    with tarfile.open(p, "w:gz") as tf:
        info = tarfile.TarInfo("ops.csv")
        info.type = tarfile.LNKTYPE
        info.linkname = "missing.csv"
        tf.addfile(info)
    return p


def _corrupt_xz(tmp_path):
    rng = np.random.default_rng(0)
    text = pd.DataFrame({"a": rng.integers(0, 1 << 40, 3000), "b": rng.random(3000)}).to_csv()
    p = tmp_path / "logs.tar.xz"
    with tarfile.open(p, "w:xz") as tf:
        for i in range(3):  # fixed headers (no mtime): the same bytes on every run
            info = tarfile.TarInfo(f"r{i}/ops.csv")
            info.size = len(text)
            tf.addfile(info, io.BytesIO(text.encode()))
    data = bytearray(p.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0x5A  # inside the xz stream: LZMAError, not tarfile.ReadError
    p.write_bytes(bytes(data))
    return p


FUZZ_FINDINGS = {
    "corrupt gzip": (_corrupt_gzip, r"ops\.csv\.gz: corrupt or truncated gzip data"),
    "nesting": (_deep_json, r"ops\.jsonl, line 1: JSON nested too deeply"),
    "huge int": (lambda t: _jsonl(t, _huge_int),
                 r"column 'nbytes', line 2: out of range \(got '1000.*\(401 digits\)'"),
    "bool": (lambda t: _jsonl(t, _bool_bytes),
             r"column 'nbytes', line 1: a boolean, not a number \(got True"),
    "2**70": (lambda t: _csv_edit(t, _start_ns_2p70),
              r"column 'start_ns', line 5: out of range \(got 1180591620717411303424"),
    "uint64": (_uint64_parquet, r"column 'start_ns', row 3: out of range"),
    "two levels": (_two_level_columns, r"columns with several levels"),
    "dup header": (lambda t: _csv_edit(t, lambda ls: [ls[0] + ",rank"] +
                                       [x + ",9" for x in ls[1:]]),
                   r"ops\.csv, line 1: column named twice in the header \(got 'rank'"),
    "extra field": (lambda t: _csv_edit(t, lambda ls: ls[:5] + [ls[5] + ",7"] + ls[6:]),
                    r"ops\.csv, line 6: has 10 fields, the header 9"),
    "trailing delimiter": (lambda t: _csv_edit(t, lambda ls: [ls[0]] + [x + "," for x in ls[1:]]),
                           r"ops\.csv, line 2: has 10 fields, the header 9 .*"
                           r"delimiter at the end"),
    "a line of 10**5 fields": (lambda t: _csv_edit(t, lambda ls: [ls[0], "1," * 100_000]),
                               r"ops\.csv, line 2: has over \d{5} fields, the header 9"),
    "carriage returns": (lambda t: _csv_edit(t, lambda ls: ["\r".join(ls[:3] + ["x"])]),
                         r"ops\.csv, line 4: has 1 of the header's 9 fields"),
    "quote never closed": (lambda t: _csv_edit(t, lambda ls: ls[:3] + ['"' + ls[3]] + ls[4:]),
                           r"ops\.csv, line 4: a quoted field starting on this line is never "
                           r"closed"),
    "5,000-digit member": (lambda t: _jsonl(t, lambda rows: rows[2].update(
        group_ranks="9" * 5000)), r"column 'group_ranks', line 3: not a list of ranks \(got "
        r"'9{200}\.\.\. \(5000 characters\)'"),
    "hard link": (_hardlink_to_nothing, r"logs\.tar\.gz: cannot unpack archive: missing member"),
    "corrupt xz": (_corrupt_xz, r"logs\.tar\.xz: cannot unpack archive"),
}


@pytest.mark.parametrize("case", FUZZ_FINDINGS)
def test_fuzzed_inputs_get_one_clear_error(tmp_path, case):
    """Each used to end in a traceback (zlib.error, RecursionError, OverflowError, TypeError,
    KeyError, LZMAError) or in wrong data (a value wrapped to a negative int64, a boolean read
    as 1, a column shifted or read twice)."""
    make, message = FUZZ_FINDINGS[case]
    with pytest.raises(SchemaError, match=message):
        read_ops(make(tmp_path))


def test_json_with_a_byte_order_mark_reads_like_without(tmp_path):
    plain = _jsonl(tmp_path, lambda rows: None)
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    pd.testing.assert_frame_equal(read_ops(marked), read_ops(plain))


def test_a_fifo_is_refused_not_read_forever(tmp_path):
    fifo = tmp_path / "ops.csv"
    os.mkfifo(fifo)
    with pytest.raises(SchemaError, match=r"ops\.csv: not a regular file"):
        read_ops(fifo, format="native")


def test_an_empty_path_is_not_the_current_directory(tmp_path):
    with pytest.raises(SchemaError, match="paths: empty path"):
        read_ops("")
    with pytest.raises(TypeError, match="paths: got NoneType"):
        read_ops(None)  # type: ignore[arg-type]


def test_a_converter_slip_names_the_format_and_file(tmp_path, monkeypatch):
    """Whatever a converter's own checks miss is reported as unreadable input, not a crash."""
    import holmes_ml.io.kineto as kineto

    def broken(files):
        return {}["traceEvents"]

    monkeypatch.setattr(kineto, "read_kineto", broken)
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"traceEvents": [], "distributedInfo": {"rank": 0}}))
    with pytest.raises(SchemaError, match=r"rank-0\.json: cannot read as kineto: KeyError"):
        read_ops(p, format="kineto")


def test_logs_of_two_jobs_in_one_directory_name_both_files(tmp_path):
    df = _ops()
    d = tmp_path / "logs"
    d.mkdir()
    df.assign(job="pretrain-7").to_csv(d / "a.csv", index=False)
    df.assign(job="finetune-2", iteration=df["iteration"] + 100).to_csv(d / "b.csv",
                                                                        index=False)
    with pytest.raises(SchemaError) as err:
        read_ops(d)
    msg = str(err.value)
    assert f"logs of a second job at {d / 'b.csv'} line 2 (got 'finetune-2'" in msg, msg
    assert f"'pretrain-7' as in {d / 'a.csv'} line 2; read each job's logs" in msg, msg


def test_a_csv_not_in_utf8_names_its_line_and_a_gzipped_one_reads_whatever_its_name(tmp_path):
    ops = _ops()
    text = ops.to_csv(index=False).encode()
    lines = text.split(b"\n")
    lines[3] = lines[3][:4] + b"\xff" + lines[3][4:]
    (tmp_path / "latin.csv").write_bytes(b"\n".join(lines))
    with pytest.raises(SchemaError, match=r"latin\.csv, line 4: not UTF-8 text \(got 'byte "
                       r"0xff at offset \d+'"):
        read_ops(tmp_path / "latin.csv")
    (tmp_path / "packed.csv").write_bytes(gzip.compress(text))  # gzip under a plain name
    pd.testing.assert_frame_equal(_sorted(read_ops(tmp_path / "packed.csv")),
                                  _sorted(read_ops(_write_csv(tmp_path / "plain.csv", text))))


def _write_csv(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", ["zeros.csv", "zeros.csv.gz", "big.jsonl"])
def test_a_log_without_line_breaks_is_refused_before_it_is_parsed(tmp_path, name):
    # 64 MB of zero bytes (a few hundred kB gzipped) took gigabytes in the CSV parser
    p = tmp_path / name
    data = bytes(64 << 20) if "zeros" in name else b'{"a": "' + b"x" * (8 << 20) + b'"}'
    p.write_bytes(gzip.compress(data, compresslevel=1) if name.endswith(".gz") else data)
    with pytest.raises(SchemaError, match=f"{name}, line 1: no line break in the first 1 MiB"):
        read_ops(p)
    # a short file without a final line break is no such case
    ok = tmp_path / "one.csv"
    ok.write_text(_ops().head(1).to_csv(index=False).rstrip("\n"))
    assert len(read_ops(ok)) == 1


def test_utf16_text_is_named_whatever_the_file_is_called(tmp_path, caplog):
    # a Flight Recorder JSON dump without an extension, saved as UTF-16: its commas made it a
    # "CSV" whose header was 'column named twice'
    doc = json.dumps({"rank": 0, "pg_config": {}, "entries": []}, indent=1)
    for name, encoding in [("nccl_trace_rank_0", "utf-16"), ("ops.csv", "utf-16-le")]:
        p = tmp_path / name
        p.write_bytes(doc.encode(encoding))
        with pytest.raises(SchemaError, match=f"{name}: UTF-16 text"):
            read_ops(p)
    logs = tmp_path / "logs"
    logs.mkdir()
    _ops().to_csv(logs / "rank0.csv", index=False)
    (logs / "notes.txt").write_bytes("a,b,c\n1,2,3\n".encode("utf-16"))
    with caplog.at_level(logging.WARNING):
        assert len(read_ops(logs)) == len(_ops())
    assert "notes.txt: UTF-16 text, not UTF-8, skipped" in caplog.text
    # a file named as a log is one: refused, not skipped
    (logs / "rank1.csv").write_bytes(_ops().to_csv(index=False).encode("utf-16"))
    with pytest.raises(SchemaError, match="rank1.csv: UTF-16 text"):
        read_ops(logs)


def test_a_dangling_link_in_a_log_directory_is_named(tmp_path, caplog):
    logs = tmp_path / "logs"
    logs.mkdir()
    _ops().to_csv(logs / "rank0.csv", index=False)
    (logs / "rank1.csv").symlink_to(tmp_path / "gone.csv")  # the other node's share unmounted
    with caplog.at_level(logging.WARNING):
        assert len(read_ops(logs)) == len(_ops())
    assert "rank1.csv: a symbolic link to nothing readable, skipped" in caplog.text


def test_a_jsonl_line_still_being_written_is_left_out_with_a_warning(tmp_path, caplog):
    """A live log's last line is often half written: read the rest, say what was left out;
    the same bytes anywhere else (or a line that has its end) are still refused."""
    df = _ops(n_ranks=2, iters=3)
    whole = df.to_json(orient="records", lines=True)
    if not whole.endswith("\n"):
        whole += "\n"
    torn = whole + whole.splitlines()[0][:25]  # the writer is mid-line
    live = tmp_path / "live.jsonl"
    live.write_text(torn)
    with caplog.at_level(logging.WARNING):
        got = read_ops(live)
    assert len(got) == len(df)
    assert f"line {len(df) + 1}: no end of line and not JSON yet" in caplog.text
    assert str(live) in caplog.text
    # ... with its end it is a malformed line, refused by number
    ended = tmp_path / "ended.jsonl"
    ended.write_text(torn + "\n")
    with pytest.raises(SchemaError, match=rf"ended.jsonl, line {len(df) + 1}: malformed JSON"):
        read_ops(ended)
    # ... and so is a torn line in the middle of the file
    middle = tmp_path / "middle.jsonl"
    lines = whole.splitlines()
    middle.write_text("\n".join([lines[0], lines[1][:25], *lines[2:]]))
    with pytest.raises(SchemaError, match=r"middle.jsonl, line 2: malformed JSON"):
        read_ops(middle)


@pytest.mark.parametrize(("given", "written", "hinted"), [
    ("flight-recorder", "kineto", "kineto"),
    ("nccl-inspector", "kineto", "kineto"),
    ("kineto", "flight-recorder", "flight-recorder"),
    ("bytedance", "native", "native"),
    ("native", "bytedance", "bytedance"),
])
def test_a_file_read_as_the_wrong_format_is_named_with_the_one_that_reads_it(
        tmp_path, given, written, hinted):
    """--format X on a file of format Y said only what X expected; the error now says which
    --format reads it (once: a reader that said so already is left alone)."""
    if written == "kineto":
        path = tmp_path / "trace.json"
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    elif written == "flight-recorder":
        path = tmp_path / "nccl_trace_rank_0.json"
        path.write_text(json.dumps({"version": "2.4", "rank": 0, "pg_config": {},
                                    "entries": []}))
    elif written == "native":
        path = tmp_path / "ops.parquet"
        _ops().to_parquet(path)
    else:
        path = tmp_path / "trace-X.parquet"
        pd.DataFrame({c: [] for c in TRACE_COLUMNS}).to_parquet(path)
    with pytest.raises(SchemaError) as err:
        read_ops(path, format=given)
    said = str(err.value)
    assert str(path) in said and said.count("--format") == 1, said
    assert f"--format {hinted} or auto" in said, said


@pytest.mark.parametrize("sep", [";", "\t"])
def test_a_csv_of_another_separator_says_so(tmp_path, sep, caplog):
    """A CSV separated by ';' was 'missing required column(s) iteration, rank, ...' (every one
    of them was there), and in a directory every file was 'not a log of a known format'."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _ops().to_csv(logs / "rank0.csv", index=False, sep=sep)
    for path in (logs / "rank0.csv", logs):
        with pytest.raises(SchemaError) as got:
            read_ops(path)
        assert f"rank0.csv: one column, {'iteration' + sep + 'rank'!r}"[:-1] in str(got.value)
        assert f"the fields are separated by {sep!r}" in str(got.value)


def test_zip_and_zstd_archives_are_named_as_such(tmp_path, caplog):
    """A .zip of traces was 'cannot tell the format ... name it with --format', and every
    --format then refused it: holmes reads tar archives, and says so."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "traces.zip", "w") as z:
        z.writestr("rank0.csv", _ops().to_csv(index=False))
    with pytest.raises(SchemaError, match="traces.zip: a zip archive, which holmes does not "
                       "unpack: unzip it and give the directory"):
        read_ops(tmp_path / "traces.zip")
    (tmp_path / "logs.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(60))
    with pytest.raises(SchemaError, match="logs.tar.zst: zstd-compressed"):
        read_ops(tmp_path / "logs.tar.zst")
    # beside logs, skipped naming why
    _ops().to_csv(tmp_path / "rank0.csv", index=False)
    with caplog.at_level("WARNING"):
        assert len(read_ops(tmp_path)) == len(_ops())
    assert "traces.zip: a zip archive, which holmes does not unpack" in caplog.text


def test_a_json_trace_cut_short_is_named_so(tmp_path):
    """A trace whose copy was interrupted was 'malformed JSON at line 2988, column 28:
    Expecting ',' delimiter', the file's last line, without saying it ends there."""
    doc = json.dumps({"traceEvents": [{"name": "x", "ph": "X", "ts": i, "dur": 1}
                                      for i in range(50)]}, indent=1)
    (tmp_path / "rank0.pt.trace.json").write_text(doc[: len(doc) // 2])
    with pytest.raises(SchemaError, match=r"rank0.pt.trace.json: cut short: the JSON ends at "
                       r"line \d+, column \d+ within a value"):
        read_ops(tmp_path / "rank0.pt.trace.json", format="kineto")
    (tmp_path / "bad.pt.trace.json").write_text(doc.replace('"ph"', "ph", 1))
    with pytest.raises(SchemaError, match="malformed JSON at line"):
        read_ops(tmp_path / "bad.pt.trace.json", format="kineto")


def test_a_format_named_for_a_mixed_directory_reads_its_files_of_that_format(tmp_path, caplog):
    """A directory of CSV logs beside other files that are Kineto traces had no way in: auto
    refused the mix, --format native refused the traces and --format kineto the CSVs. Named,
    a format now reads its files and skips the others' with a warning."""
    ops = _ops()
    ops.to_csv(tmp_path / "rank0.csv", index=False)
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(
        {"schemaVersion": 1, "traceEvents": [], "distributedInfo": {"rank": 0}}))
    with pytest.raises(SchemaError, match="files of different formats in one input .*name one "
                       "with --format"):
        read_ops(tmp_path)
    with caplog.at_level("WARNING"):
        assert len(read_ops(tmp_path, format="native")) == len(ops)
    assert "rank0.pt.trace.json: a kineto log, not native: skipped (--format kineto reads it)" \
        in caplog.text
