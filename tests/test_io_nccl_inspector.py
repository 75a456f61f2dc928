"""NCCL Inspector JSON Lines as the plugin writes them (v4.0, v4.2 and v4.3 layouts).

The fixture lines follow the writer code in NVIDIA/nccl, not the other way round:

* v4.0: ``ext-profiler/inspector/inspector.cc`` (commit 1e0c869c) -- one compact object per
  line with ``header`` {id, rank, n_ranks, nnodes}, ``metadata`` {inspector_output_format_version,
  git_rev, rec_mechanism, dump_timestamp_us, hostname, pid} and ``coll_perf``; verbose adds
  ``event_trace_sn`` / ``event_trace_ts``.
* v4.2: ``plugins/profiler/inspector/inspector_json.cc`` (commit 35d819ec) -- ``header`` gains
  ``comm_name``, ``coll_perf`` gains ``coll_algo``/``coll_proto``, ``p2p_perf`` lines, and a
  self-contained ``dump_stats`` record opens each communicator's dump.
* v4.3: ``plugins/profiler/inspector/README.md`` (commit 3254c695) and
  ``inspector_json_reader.py`` -- header/metadata only on the ``dump_stats`` marker, followed by
  ``coll_records + p2p_records + proxy_records`` single-key payload lines.
"""

from __future__ import annotations

import gzip
import json
import logging
import re

import numpy as np
import pytest

from holmes_ml.io import SchemaError, detect_format, read_ops
from holmes_ml.io.nccl_inspector import SEQ_STRIDE

T0_US = 1_752_867_229_000_000
WORLD = "0xe62dedaa97644a"
# A 2-rank communicator of global ranks 3 and 1, in that comm-rank order.
PAIR = "0x9e7a479f95a66c"
PAIR_MEMBERS = (3, 1)


def _line(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":"))  # the plugin writes compact JSON


def _header(comm, rank, n, name=None):
    h = {"id": comm}
    if name is not None:  # v4.2+ only
        h["comm_name"] = name
    h.update({"rank": rank, "n_ranks": n, "nnodes": 1})
    return h


def _meta(version, dump_us, pid, host="node-0"):
    return {"inspector_output_format_version": version, "git_rev": "", "rec_mechanism":
            "nccl_profiler_interface", "dump_timestamp_us": dump_us, "hostname": host,
            "pid": pid}


def _coll(coll, sn, dur_us, size=1 << 26, start_us=None, algo=False):
    p = {"coll": coll}
    if algo:
        p.update({"coll_algo": "RING", "coll_proto": "SIMPLE"})
    p.update({"coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": dur_us,
              "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 277.210914,
              "coll_busbw_gbs": 485.119099})
    if start_us is not None:
        p["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": [
            {"channel_id": c, "kernel_start_sn": 3 + c, "kernel_stop_sn": 48,
             "kernel_record_sn": 47} for c in range(2)]}
        p["event_trace_ts"] = {
            "coll_start_ts": start_us - 120, "coll_stop_ts": start_us - 115,
            "kernel_events": [{"channel_id": c, "kernel_start_ts": start_us + 3 * c,
                               "kernel_stop_ts": start_us + dur_us, "kernel_record_ts":
                               start_us + dur_us} for c in range(2)]}
    return p


def _p2p(kind, sn, peer, dur_us, size=1 << 20):
    return {"p2p": kind, "p2p_sn": sn, "p2p_peer": peer, "p2p_msg_size_bytes": size,
            "p2p_exec_time_us": dur_us, "p2p_timing_source": "kernel_gpu",
            "p2p_algobw_gbs": 12.5, "p2p_busbw_gbs": 12.5}


def _stats(coll, p2p, dropped=0, proxy=None):
    s = {"coll_records": coll, "coll_dropped_total": dropped, "coll_dropped_since_last_dump":
         dropped, "p2p_records": p2p, "p2p_dropped_total": 0, "p2p_dropped_since_last_dump": 0}
    if proxy is not None:
        s.update({"proxy_records": proxy, "proxy_dropped_total": 0,
                  "proxy_dropped_since_last_dump": 0})
    return s


def _durations(seed, slow):
    rng = np.random.default_rng(seed)
    d = rng.integers(900, 1100, size=(4, 6))
    d[[r for r in range(4) if r != slow]] += 3000  # the others wait for the straggler
    return d


def test_v40_self_contained_lines(tmp_path):
    d = tmp_path / "nccl-inspector-unknown-jobid"
    d.mkdir()
    dur = _durations(0, slow=1)
    for r in range(4):
        pid = 1000 + r
        lines = []
        for sn in range(6):
            dump = T0_US + (sn + 1) * 10**5
            # AllReduce and AllGather share the world communicator and each count from 0.
            coll = "AllReduce" if sn % 2 == 0 else "AllGather"
            verbose = dump - 5000 if sn % 3 == 0 else None
            lines.append(_line({"header": _header(WORLD, r, 4),
                                "metadata": _meta("v4.0", dump, pid),
                                "coll_perf": _coll(coll, sn // 2, int(dur[r, sn]),
                                                   start_us=verbose)}))
        if r in PAIR_MEMBERS:
            local = PAIR_MEMBERS.index(r)
            lines.append(_line({"header": _header(PAIR, local, 2),
                                "metadata": _meta("v4.0", T0_US + 10**6, pid),
                                "coll_perf": _coll("Broadcast", 7, 50, size=4096)}))
        text = "\n".join(lines) + "\n"
        p = d / f"node-0-pid{pid}.log"
        if r % 2:
            p = d / f"node-0-pid{pid}.log.gz"
            p.write_bytes(gzip.compress(text.encode()))
        else:
            p.write_text(text)
    assert {detect_format(p) for p in d.iterdir()} == {"nccl-inspector"}
    ops = read_ops(d)
    world = ops[ops["group"] == f"comm-{WORLD}"].sort_values(["rank", "start_ns"])
    assert len(world) == 24 and sorted(set(ops["rank"])) == [0, 1, 2, 3]
    np.testing.assert_allclose(world["duration_us"].to_numpy(), dur.ravel())
    assert world.groupby("rank")["duration_us"].median().idxmin() == 1
    # Per-type NCCL counters must not collide: 6 distinct instances, each seen by 4 ranks.
    assert world.groupby("seq")["rank"].nunique().eq(4).all() and world["seq"].nunique() == 6
    assert (world["seq"] // SEQ_STRIDE == world["nccl_sn"]).all()
    same_sn = world[(world["rank"] == 0) & (world["nccl_sn"] == 1)]
    assert len(same_sn) == 2 and same_sn["seq"].nunique() == 2
    assert world.groupby("op")["nccl_sn"].max().to_dict() == {"all_gather": 2, "all_reduce": 2}
    # Verbose records start at their first kernel; the others at dump time minus duration.
    first = world[(world["rank"] == 0) & (world["op"] == "all_reduce") & (world["nccl_sn"] == 0)]
    assert first["start_ns"].iloc[0] == (T0_US + 10**5 - 5000) * 1000
    assert bool(first["start_exact"].iloc[0])
    other = world[(world["rank"] == 0) & (world["op"] == "all_gather") & (world["nccl_sn"] == 0)]
    assert other["start_ns"].iloc[0] == (T0_US + 2 * 10**5) * 1000 - int(dur[0, 1]) * 1000
    assert not bool(other["start_exact"].iloc[0])
    # The 2-rank communicator: comm-local ranks mapped to the job-wide ranks 3 and 1.
    pair = ops[ops["group"] == f"comm-{PAIR}"]
    assert sorted(pair["rank"]) == [1, 3] and set(pair["comm_rank"]) == {0, 1}
    assert set(pair["group_ranks"]) == {"3 1"} and set(world["group_ranks"]) == {"0 1 2 3"}
    assert (ops["host"] == "node-0").all() and (world["group_size"] == 4).all()


def test_v42_dump_stats_records_and_p2p(tmp_path, caplog):
    p = tmp_path / "node-1-pid77.log"
    for r, pid in ((0, 77), (1, 78)):
        path = tmp_path / f"node-1-pid{pid}.log"
        dump = T0_US + 10**6
        rec = [_line({"header": _header(WORLD, r, 2, "default_pg"),
                      "metadata": _meta("v4.2", dump, pid),
                      "dump_stats": _stats(2, 1, dropped=5 if r else 0)})]
        for sn in range(2):
            rec.append(_line({"header": _header(WORLD, r, 2, "default_pg"),
                              "metadata": _meta("v4.2", dump + sn, pid),
                              "coll_perf": _coll("ReduceScatter", sn, 700 + sn, algo=True)}))
        kind = "Send" if r == 0 else "Recv"
        rec.append(_line({"header": _header(WORLD, r, 2, "default_pg"),
                          "metadata": _meta("v4.2", dump + 2, pid),
                          "p2p_perf": _p2p(kind, 0, 1 - r, 90)}))
        path.write_text("\n".join(rec) + "\n")
    assert detect_format(p) == "nccl-inspector"
    with caplog.at_level(logging.WARNING, logger="holmes_ml.io.nccl_inspector"):
        ops = read_ops(tmp_path)
    assert "dropped 5 records" in caplog.text
    assert len(ops) == 6
    assert set(ops.loc[ops["op"] == "reduce_scatter", "algo"]) == {"RING"}
    p2p = ops[ops["op"].isin(["send", "recv"])].set_index("rank")
    assert p2p.loc[0, "op"] == "send" and p2p.loc[0, "peer"] == 1 and p2p.loc[1, "peer"] == 0
    assert (ops.loc[ops["op"] == "reduce_scatter", "peer"] == -1).all()
    assert set(ops["comm_name"]) == {"default_pg"}


def _v43_dump(rank, pid, dump_us, colls, p2ps=(), proxies=0, counts=None):
    n = counts or (len(colls), len(p2ps), proxies)
    out = [_line({"header": _header(WORLD, rank, 2, "default_pg"),
                  "metadata": _meta("v4.3", dump_us, pid),
                  "dump_stats": _stats(n[0], n[1], proxy=n[2])})]
    out += [_line({"coll_perf": c}) for c in colls]
    out += [_line({"p2p_perf": q}) for q in p2ps]
    out += [_line({"proxy_trace": {"record_type": "proxy_op", "record_sn": i, "parent_type":
                                   "coll", "parent_sn": 0, "proxy_op_sn": i, "rank": rank,
                                   "channel_id": 0, "peer": 1 - rank, "direction": "send"}})
            for i in range(proxies)]
    return out


def test_v43_marker_carries_the_context(tmp_path):
    for r in range(2):
        pid = 500 + r
        lines = []
        for dump in range(2):
            colls = [_coll("AllReduce", dump * 3 + sn, 400 + 10 * r + sn, algo=True)
                     for sn in range(3)]
            lines += _v43_dump(r, pid, T0_US + dump * 10**6, colls, proxies=2 if dump else 0)
        (tmp_path / f"h-pid{pid}.log").write_text("\n".join(lines) + "\n")
    assert detect_format(tmp_path / "h-pid500.log") == "nccl-inspector"
    ops = read_ops(tmp_path)
    assert len(ops) == 12 and set(ops["op"]) == {"all_reduce"}
    r1 = ops[ops["rank"] == 1].sort_values("nccl_sn")
    assert list(r1["nccl_sn"]) == list(range(6))
    np.testing.assert_allclose(r1["duration_us"], [410, 411, 412, 410, 411, 412])
    # Records of the second dump take the second marker's dump time.
    assert r1["start_ns"].iloc[3] == (T0_US + 10**6) * 1000 - 410_000
    assert set(ops["group_ranks"]) == {"0 1"} and set(ops["host"]) == {"node-0"}


def test_v43_payload_without_marker(tmp_path):
    p = tmp_path / "x.log"
    p.write_text(_line({"coll_perf": _coll("AllReduce", 0, 10)}) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="nccl-inspector")
    msg = str(err.value)
    assert "x.log" in msg and "line 1" in msg and "header" in msg


@pytest.mark.parametrize("counts,field", [((3, 0, 0), "coll_records"),
                                          ((1, 0, 0), "coll_records"),
                                          ((2, 0, 1), "proxy_records")])
def test_v43_record_counts_must_match(tmp_path, counts, field):
    p = tmp_path / "y.log"
    colls = [_coll("AllReduce", sn, 10) for sn in range(2)]
    p.write_text("\n".join(_v43_dump(0, 1, T0_US, colls, counts=counts)) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="nccl-inspector")
    assert "y.log" in str(err.value) and field in str(err.value)


def test_unknown_collective_name(tmp_path):
    p = tmp_path / "y.log"
    p.write_text(_line({"header": _header(WORLD, 0, 1), "metadata": _meta("v4.0", T0_US, 1),
                        "coll_perf": _coll("AllMagic", 0, 10)}) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    # the field and line apart (the line was inside the field's name), NCCL's own spellings
    assert str(err.value) == (
        f"{p}, coll_perf.coll, line 1: unknown communication operator (got 'AllMagic'; "
        "expected an NCCL function name such as AllReduce, AllGather, ReduceScatter, "
        "Broadcast, Reduce, Send, Recv)")
    assert err.value.line == 1


@pytest.mark.parametrize("mutate,field", [
    (lambda o: o["coll_perf"].pop("coll_exec_time_us"), "coll_perf.coll_exec_time_us"),
    (lambda o: o["coll_perf"].update(coll_sn="7"), "coll_perf.coll_sn"),
    (lambda o: o["header"].pop("rank"), "header.rank"),
    (lambda o: o["metadata"].pop("dump_timestamp_us"), "metadata.dump_timestamp_us"),
    (lambda o: o.pop("coll_perf"), "coll_perf"),
])
def test_malformed_line_names_file_line_and_field(tmp_path, mutate, field):
    p, err = _read_with_a_bad_second_line(tmp_path, mutate)
    assert str(p) in err and "line 2" in err and field in err


def _read_with_a_bad_second_line(tmp_path, mutate) -> tuple:
    """(file, error message) of a log whose second line is a good first line mutated."""
    good = {"header": _header(WORLD, 0, 1), "metadata": _meta("v4.0", T0_US, 1),
            "coll_perf": _coll("AllReduce", 0, 10)}
    bad = json.loads(json.dumps(good))
    mutate(bad)
    p = tmp_path / "z.log"
    p.write_text(_line(good) + "\n" + _line(bad) + "\n")
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="nccl-inspector")
    return p, str(err.value)


# Malformed lines and files that contradict each other ----------------------------------------

def _perf(**fields):
    return lambda o: o["coll_perf"].update(fields)


def _head(**fields):
    return lambda o: o["header"].update(fields)


def _as_p2p(**fields):
    def mutate(o):
        del o["coll_perf"]
        o["header"]["n_ranks"] = 2
        o["p2p_perf"] = {**_p2p("Send", 0, 1, 90), **fields}
    return mutate


@pytest.mark.parametrize("mutate,match", [
    (_perf(coll_exec_time_us=2**70), r"coll_perf\.coll_exec_time_us, line 2: out of range"),
    (_perf(coll_exec_time_us=T0_US + 1),
     r"coll_perf\.coll_exec_time_us, line 2: operation longer than the time from the epoch"),
    (_perf(coll_sn=2**70), r"coll_perf\.coll_sn, line 2: out of range"),
    (_perf(coll="Send"), r"coll_perf\.coll, line 2: Send in coll_perf"),
    (_perf(coll_algo={}), r"coll_perf\.coll_algo, line 2: wrong type \(got 'dict'"),
    (_perf(event_trace_ts={"kernel_events": 5}),
     r"coll_perf\.event_trace_ts\.kernel_events, line 2: wrong type \(got 'int'"),
    (_perf(event_trace_ts={"kernel_events": [{"kernel_start_ts": "x"}]}),
     r"kernel_events\[0\]\.kernel_start_ts, line 2: bad or missing field \(got 'x'"),
    (_as_p2p(p2p_peer=2**70), r"p2p_perf\.p2p_peer, line 2: out of range"),
    (_as_p2p(p2p_peer=2), r"p2p_perf\.p2p_peer, line 2: out of range \(got 2; expected an "
     r"integer in \[0, 1\]"),
    (_head(rank=2**70), r"header\.rank, line 2: out of range"),
    (_head(rank=-2), r"header\.rank, line 2: out of range \(got -2"),
    (_head(rank=7, n_ranks=4), r"header\.rank, line 2: out of range \(got 7; expected an "
     r"integer in \[0, 3\]"),
    (_head(n_ranks=2**70), r"header\.n_ranks, line 2: out of range"),
    (_head(n_ranks=-4), r"header\.n_ranks, line 2: out of range \(got -4"),
    (_head(nnodes="x"), r"header\.nnodes, line 2: bad or missing field \(got 'x'"),
    (_head(nnodes=1.5), r"header\.nnodes, line 2: bad or missing field \(got 1\.5"),
    (_head(id="0x\ud800"), r"header\.id, line 2: not valid Unicode text"),
    (lambda o: o["metadata"].update(dump_timestamp_us=2**70),
     r"metadata\.dump_timestamp_us, line 2: out of range"),
    (lambda o: o["metadata"].update(hostname={}), r"metadata\.hostname, line 2: wrong type"),
])
def test_malformed_field_names_file_line_field_and_problem(tmp_path, mutate, match):
    p, err = _read_with_a_bad_second_line(tmp_path, mutate)
    assert re.search(match, err) and err.startswith(str(p)), err


def test_format_version_with_thousands_of_digits(tmp_path):
    p = tmp_path / "h-pid1.log"
    lines = _v43_dump(0, 1, T0_US, [_coll("AllReduce", 0, 10)])
    marker = json.loads(lines[0])
    marker["metadata"]["inspector_output_format_version"] = "4." + "9" * 5000
    p.write_text("\n".join([_line(marker)] + lines[1:]) + "\n")
    with pytest.raises(SchemaError, match=r"inspector_output_format_version, line 1: format "
                       r"version out of range"):
        read_ops(p, format="nccl-inspector")


def _world_files(d, change):
    """4 processes of the 4-rank world communicator; ``change(rank, header)`` edits headers."""
    for r in range(4):
        lines = []
        for sn in range(2):
            header = _header(WORLD, r, 4)
            change(r, header)
            lines.append(_line({"header": header, "metadata": _meta("v4.0", T0_US + sn, 100 + r),
                                "coll_perf": _coll("AllReduce", sn, 10)}))
        (d / f"n-pid{100 + r}.log").write_text("\n".join(lines) + "\n")
    return d


@pytest.mark.parametrize("change,match", [
    # One process says the world has 8 ranks: every other process would be renumbered.
    (lambda r, h: h.update(n_ranks=8) if r == 2 else None,
     r"n-pid102\.log, header\.n_ranks, line 1: processes disagree on the size of "
     r"communicator 0xe62dedaa97644a: 8 here, 4 in .*n-pid100\.log line 1"),
    # Two processes claim comm rank 0: they would be merged into one rank.
    (lambda r, h: h.update(rank=0) if r == 1 else None,
     r"n-pid101\.log, header\.rank, line 1: two processes claim rank 0 of communicator "
     r"0xe62dedaa97644a: node-0/101 here, node-0/100 in .*n-pid100\.log line 1"),
])
def test_processes_that_contradict_each_other_are_refused(tmp_path, change, match):
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir()
    good.mkdir()
    with pytest.raises(SchemaError, match=match):
        read_ops(_world_files(bad, change), format="nccl-inspector")
    ops = read_ops(_world_files(good, lambda r, h: None))  # without the contradiction
    assert sorted(set(ops["rank"])) == [0, 1, 2, 3]
