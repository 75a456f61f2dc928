"""NCCL Inspector JSONL: v4.0 self-contained lines and v4.3 dump_stats marker style."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from holmes_ml.io import SchemaError, detect_format, read_ops

T0_US = 1_752_867_229_000_000
COMM = "0xe62dedaa97644a"


def _perf(sn, dur, size=1 << 26, coll="AllReduce", verbose_start=None):
    p = {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": dur,
         "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 100.0, "coll_busbw_gbs": 175.0}
    if verbose_start is not None:
        p["event_trace_ts"] = {"coll_start_ts": verbose_start - 100, "coll_stop_ts": verbose_start,
                               "kernel_events": [{"channel_id": c, "kernel_start_ts":
                                                  verbose_start + c, "kernel_stop_ts":
                                                  verbose_start + dur}
                                                 for c in range(2)]}
    return p


def _header(rank):
    return {"id": COMM, "rank": rank, "n_ranks": 4, "nnodes": 1}


def _meta(version, dump_us):
    return {"inspector_output_format_version": version, "git_rev": "", "dump_timestamp_us":
            dump_us, "hostname": "node-0", "pid": 100, "rec_mechanism": "profiler_plugin"}


def _durations(seed=0, slow=None):
    rng = np.random.default_rng(seed)
    d = rng.uniform(900, 1100, size=(4, 6))
    if slow is not None:
        d[[r for r in range(4) if r != slow]] += 3000
    return d


def test_v40_self_contained_lines(tmp_path):
    d = tmp_path / "insp"
    d.mkdir()
    dur = _durations(slow=1)
    for r in range(4):
        lines = [json.dumps({"header": _header(r), "metadata": _meta("v4.0", T0_US + sn * 10**5),
                             "coll_perf": _perf(sn, float(dur[r, sn]),
                                                verbose_start=T0_US + sn * 10**5 - 5000
                                                if sn % 2 else None)})
                 for sn in range(6)]
        text = "\n".join(lines) + "\n"
        p = d / f"rank{r}.log.gz" if r % 2 else d / f"rank{r}.log"
        p.write_bytes(gzip.compress(text.encode()) if r % 2 else text.encode())
    assert {detect_format(p) for p in d.iterdir()} == {"nccl-inspector"}
    ops = read_ops(d)
    assert len(ops) == 24 and set(ops["group"]) == {f"comm-{COMM}"}
    assert (ops.groupby("seq")["rank"].nunique() == 4).all()
    np.testing.assert_allclose(
        ops.sort_values(["rank", "seq"])["duration_us"].to_numpy(), dur.ravel())
    assert ops.groupby("rank")["duration_us"].median().idxmin() == 1
    # Verbose records are timed by their first kernel; others from the dump time.
    row = ops[(ops["rank"] == 0) & (ops["seq"] == 1)].iloc[0]
    assert row["start_ns"] == (T0_US + 10**5 - 5000) * 1000 and row["start_exact"]
    row = ops[(ops["rank"] == 0) & (ops["seq"] == 2)].iloc[0]
    assert row["start_ns"] == (T0_US + 2 * 10**5) * 1000 - round(dur[0, 2] * 1000)
    assert not row["start_exact"]
    assert (ops["host"] == "node-0").all() and (ops["group_size"] == 4).all()


def test_v43_dump_stats_markers(tmp_path):
    p = tmp_path / "rank2.jsonl"
    lines = []
    for dump in range(2):
        lines.append({"dump_stats": {"header": _header(2),
                                     "metadata": _meta("v4.3", T0_US + dump * 10**6)}})
        for sn in range(3):
            lines.append({"coll_perf": _perf(dump * 3 + sn, 500.0 + sn, coll="ReduceScatter")})
    p.write_text("\n".join(json.dumps(x) for x in lines))
    assert detect_format(p) == "nccl-inspector"
    ops = read_ops(p)
    assert list(ops["seq"]) == list(range(6)) and set(ops["op"]) == {"reduce_scatter"}
    assert set(ops["rank"]) == {2}
    # The second dump's records take the second marker's time.
    assert ops["start_ns"].iloc[3] == (T0_US + 10**6) * 1000 - 500_000


def test_record_before_any_header(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"coll_perf": _perf(0, 10.0)}) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="nccl-inspector")
    assert "x.jsonl" in str(err.value) and "header" in str(err.value)


def test_unknown_collective_name(tmp_path):
    p = tmp_path / "y.jsonl"
    p.write_text(json.dumps({"header": _header(0), "metadata": _meta("v4.0", T0_US),
                             "coll_perf": _perf(0, 10.0, coll="AllMagic")}) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "y.jsonl" in str(err.value) and "AllMagic" in str(err.value)
