"""Flight Recorder dumps: a small realistic 4-rank fixture (torch is not needed)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from holmes_ml.io import SchemaError, detect_format, read_ops
from holmes_ml.io.flight_recorder import hang_report, load_dump, read_flight_recorder

T0 = 1_700_000_000_000_000_000


def _entry(i, seq, op="nccl:all_reduce", pg=("0", "default_pg"), start=0, dur_ms=1.5,
           state="completed", p2p=None, nelems=1024, dtype="Float"):
    e = {
        "record_id": i, "pg_id": 0, "process_group": list(pg),
        "collective_seq_id": seq if p2p is None else 0, "p2p_seq_id": p2p or 0, "op_id": i,
        "profiling_name": op, "time_created_ns": T0 + start - 5000,
        "input_sizes": [[nelems]], "input_dtypes": [dtype],
        "output_sizes": [[nelems]], "output_dtypes": [dtype],
        "state": state, "retired": state == "completed", "timeout_ms": 600000,
        "is_p2p": p2p is not None, "frames": [{"name": "all_reduce", "filename": "x.py",
                                              "line": 1}],
    }
    if dur_ms is not None:
        e["duration_ms"] = dur_ms
        e["time_discovered_started_ns"] = T0 + start
        e["time_discovered_completed_ns"] = T0 + start + int(dur_ms * 1e6)
    return e


def _dump(rank, n_coll=5, slow_rank=None, stop_at=None, world=4):
    rng = np.random.default_rng(rank)
    entries = []
    for s in range(1, n_coll + 1):
        if stop_at is not None and s > stop_at:
            break
        dur = 2.0 + float(rng.uniform(0, 0.1))
        if slow_rank is not None and rank != slow_rank:
            dur += 5.0  # peers wait for the straggler
        entries.append(_entry(len(entries), s, start=s * 10**8, dur_ms=dur))
    # One P2P pair between ranks 0 and 1.
    if rank in (0, 1):
        name = "nccl:send 0->1" if rank == 0 else "nccl:recv 1<-0"
        entries.append(_entry(len(entries), 0, op=name, p2p=1, start=9 * 10**8, dur_ms=0.5))
    return {"version": "2.4", "rank": rank,
            "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                "ranks": json.dumps(list(range(world)))}},
            "pg_status": {}, "entries": entries}


def _write(tmp_path, dumps, name="nccl_trace_rank_{r}"):
    d = tmp_path / "fr"
    d.mkdir()
    for r, doc in dumps.items():
        (d / name.format(r=r)).write_text(json.dumps(doc))
    return d


def test_p2p_ranks_in_a_subgroup_are_mapped_to_global_ranks(tmp_path):
    """ProcessGroupNCCL names a send/recv with ranks in its process group
    ("nccl:send 1->0" on global rank 3 of a pipeline group [1, 3]): the peer is global rank 1,
    not 0 or 3's own number."""
    pp = {"name": "5", "desc": "pp", "ranks": "[1, 3]"}
    dumps = {}
    for rank, name in ((1, "nccl:recv 0<-1"), (3, "nccl:send 1->0")):
        doc = _dump(rank)
        doc["pg_config"]["5"] = pp
        doc["entries"].append(_entry(len(doc["entries"]), 0, op=name, pg=("5", "pp"), p2p=1,
                                     start=9 * 10**8, dur_ms=0.5))
        dumps[rank] = doc
    ops = read_ops(_write(tmp_path, dumps))
    p2p = ops[ops["group"] == "5"].set_index("rank")
    assert p2p.loc[3, "op"] == "send" and p2p.loc[3, "peer"] == 1
    assert p2p.loc[1, "op"] == "recv" and p2p.loc[1, "peer"] == 3
    assert set(p2p["group_ranks"]) == {"1 3"}


def test_barriers_and_coalesced_groups_of_real_dumps(tmp_path):
    """ProcessGroupNCCL records dist.barrier() as "nccl:all_reduce_barrier", and closes each
    coalesced group (batch_isend_irecv) with a "nccl:coalesced" entry that times the group
    while its sends and recvs carry no timing of their own. Both used to refuse the dump
    ("unknown communication operator")."""
    dumps = {}
    for rank in (0, 1):
        doc = _dump(rank, n_coll=2)
        entries = doc["entries"]
        entries.insert(0, _entry(len(entries), 0, op="nccl:all_reduce_barrier", start=10**7,
                                 dur_ms=0.2, nelems=1))
        peer = 1 - rank
        for name in (f"nccl:send {rank}->{peer}", f"nccl:recv {rank}<-{peer}"):
            entries.append(_entry(len(entries), 0, op=name, p2p=7, dur_ms=None,
                                  start=20 * 10**8))
        closing = _entry(len(entries), 0, op="nccl:coalesced", p2p=7, start=20 * 10**8,
                         dur_ms=3.0 + rank)
        entries.append(closing)
        dumps[rank] = doc
    ops = read_ops(_write(tmp_path, dumps))
    assert set(ops["op"]) == {"barrier", "all_reduce", "send", "recv"}
    p2p = ops[(ops["seq"] == 7) & ops["op"].isin(["send", "recv"])]
    assert len(p2p) == 4 and set(p2p["peer"] + p2p["rank"]) == {1}
    # each member gets its group's timing
    assert p2p.groupby("rank")["duration_us"].unique().map(list).to_dict() == {
        0: [3000.0], 1: [4000.0]}


def test_read_dumps_into_ops(tmp_path):
    d = _write(tmp_path, {r: _dump(r, slow_rank=2) for r in range(4)})
    assert detect_format(next(d.iterdir())) == "flight-recorder"
    ops = read_ops(d)
    coll = ops[ops["op"] == "all_reduce"]
    assert len(coll) == 20 and sorted(coll["seq"].unique()) == [1, 2, 3, 4, 5]
    assert (coll["nbytes"] == 4096).all()
    assert set(coll["group_ranks"]) == {"0 1 2 3"}
    # The straggler's own collectives are short, its peers wait.
    med = coll.groupby("rank")["duration_us"].median()
    assert med.idxmin() == 2 and med[2] < 2200 and med.drop(2).min() > 6900
    send = ops[ops["op"] == "send"].iloc[0]
    recv = ops[ops["op"] == "recv"].iloc[0]
    assert (send["rank"], send["peer"], recv["rank"], recv["peer"]) == (0, 1, 1, 0)
    assert send["seq"] == recv["seq"] == 1


def test_rank_from_file_name_and_untimed_entries(tmp_path):
    doc = _dump(3)
    del doc["rank"]
    doc["entries"].append(_entry(99, 6, dur_ms=None, state="scheduled"))
    p = tmp_path / "nccl_trace_rank_3"
    p.write_text(json.dumps(doc))
    assert load_dump(p)["rank"] == 3
    ops = read_flight_recorder([p])
    assert set(ops["rank"]) == {3} and len(ops) == 5  # untimed entry left out


def test_gloo_dump_without_durations_is_explained(tmp_path):
    doc = {"rank": 0, "pg_config": {}, "entries": [_entry(0, 1, dur_ms=None, state="scheduled")]}
    p = tmp_path / "fr_0.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(SchemaError, match="duration"):
        read_ops(p, format="flight-recorder")


def test_pickle_refused_unless_trusted(tmp_path):
    p = tmp_path / "nccl_trace_rank_0.pkl"
    p.write_bytes(pickle.dumps(_dump(0)))
    assert detect_format(p) == "flight-recorder"
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "unpickl" in str(err.value) and "runs code" in str(err.value)
    ops = read_ops(p, trust_pickle=True)
    assert len(ops) == 6


def test_hang_report_names_the_missing_rank(tmp_path):
    dumps = {r: _dump(r, stop_at=3 if r == 1 else None) for r in range(4)}
    d = _write(tmp_path, dumps)
    findings = hang_report(sorted(d.iterdir()))
    assert len(findings) == 1
    f = findings[0]
    assert f.group == "0" and f.seq == 4 and f.missing_ranks == (1,)
    assert f.reached_ranks == (0, 2, 3) and f.op == "nccl:all_reduce"
    assert hang_report({r: dumps[r]["entries"] for r in (0, 2, 3)}) == []


def test_unknown_op_in_dump(tmp_path):
    doc = _dump(0)
    doc["entries"][2]["profiling_name"] = "nccl:teleport"
    p = tmp_path / "fr_0.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "fr_0.json" in str(err.value) and "teleport" in str(err.value)
    assert "entries[2]" in str(err.value)


# Malformed dumps: each is one SchemaError naming the file, the field and the problem ----------

def _entry0(**fields):
    """Mutation setting ``fields`` on entry 0 of rank 0's dump."""
    return lambda dumps: dumps[0]["entries"][0].update(fields)


def _untimed(started, completed):
    """Mutation giving entry 0 discovery times but no ``duration_ms``."""
    def mutate(dumps):
        e = dumps[0]["entries"][0]
        del e["duration_ms"]
        e.update(time_discovered_started_ns=started, time_discovered_completed_ns=completed)
    return mutate


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d[0].update(rank="abc"), r"rank: not an integer \(got 'abc'"),
    (lambda d: d[0].update(rank=1.5), r"rank: not an integer \(got 1\.5"),
    (lambda d: d[0].update(rank=-2), r"rank: out of range \(got -2"),
    (lambda d: d[0].update(pg_config=[1]), r"pg_config: wrong type \(got 'list'"),
    (lambda d: d[0]["pg_config"].update({"0": "x"}), r"pg_config\['0'\]: wrong type"),
    (lambda d: d[0]["pg_config"]["0"].update(ranks=["a"]),
     r"pg_config\['0'\]\.ranks: not an integer \(got 'a'"),
    (_entry0(input_sizes=5),
     r"entries\[0\]\.input_sizes: wrong type \(got 'int'; expected a JSON list\)"),
    (_entry0(input_sizes=[["a"]]), r"entries\[0\]\.input_sizes\[0\]\[0\]: not an integer"),
    (_entry0(input_sizes=[[-4]]), r"entries\[0\]\.input_sizes\[0\]\[0\]: out of range"),
    (_entry0(input_sizes=[[2**40, 2**40]]),
     r"entries\[0\]\.input_sizes: tensors larger than 2\*\*63 bytes"),
    (_entry0(input_dtypes=[1]), r"entries\[0\]\.input_dtypes\[0\]: wrong type"),
    (_untimed("abc", "xyz"),
     r"entries\[0\]\.time_discovered_started_ns: not an integer \(got 'abc'"),
    (_entry0(time_discovered_started_ns="abc"),
     r"entries\[0\]\.time_discovered_started_ns: not an integer \(got 'abc'"),
    (_entry0(time_discovered_started_ns=-5),
     r"entries\[0\]\.time_discovered_started_ns: out of range \(got -5"),
    (_entry0(time_discovered_started_ns=2**70),
     r"entries\[0\]\.time_discovered_started_ns: out of range"),
    (_entry0(duration_ms="abc"), r"entries\[0\]\.duration_ms: not a number \(got 'abc'"),
    (_entry0(collective_seq_id=None), r"entries\[0\]\.collective_seq_id: not an integer"),
    (_entry0(is_p2p="false"), r"entries\[0\]\.is_p2p: wrong type"),
    (_entry0(process_group={"a": 1}), r"entries\[0\]\.process_group: wrong type"),
    (_entry0(state="done\ud800"), r"entries\[0\]\.state: not valid Unicode text"),
    (lambda d: d[0]["entries"][-1].update(profiling_name="nccl:send 0->" + "9" * 30),
     r"entries\[5\]\.profiling_name: rank in the operator name out of range"),
])
def test_malformed_dump_names_file_field_and_problem(tmp_path, mutate, match):
    dumps = {0: _dump(0)}
    mutate(dumps)
    p = _write(tmp_path, dumps) / "nccl_trace_rank_0"
    with pytest.raises(SchemaError, match=match) as err:
        read_flight_recorder([p])
    assert str(err.value).startswith(str(p))


def test_two_dumps_of_one_rank_are_refused(tmp_path):
    dumps = {r: _dump(r) for r in range(4)}
    dumps[2]["rank"] = 1  # a stray copy of rank 1's dump, or a mislabelled one
    d = _write(tmp_path, dumps)
    for read in (read_ops, lambda d: hang_report(sorted(d.iterdir()))):
        with pytest.raises(SchemaError, match="two dumps claim rank 1") as err:
            read(d)
        assert "nccl_trace_rank_1" in str(err.value) and "nccl_trace_rank_2" in str(err.value)


def test_hang_report_checks_entries(tmp_path):
    dumps = {r: _dump(r) for r in range(2)}
    dumps[1]["entries"][3]["collective_seq_id"] = "x"
    d = _write(tmp_path, dumps)
    with pytest.raises(SchemaError, match=r"rank_1, entries\[3\]\.collective_seq_id: not an"):
        hang_report(sorted(d.iterdir()))


def test_long_profiling_name_is_parsed_in_linear_time(tmp_path):
    """The peer pattern once backtracked quadratically over a run of digits (80,000 digits:
    76 s); at 200,000 digits this test would hang instead of taking milliseconds."""
    doc = _dump(0)
    send = doc["entries"][-1]
    p = tmp_path / "nccl_trace_rank_0"
    for name, peer in (("nccl:send " + "1" * 200_000 + " 0->1", 1),
                       ("nccl:send " + "1" * 200_000, -1)):
        send["profiling_name"] = name
        p.write_text(json.dumps(doc))
        ops = read_flight_recorder([p])
        assert ops.loc[ops["op"] == "send", "peer"].tolist() == [peer]


def test_error_found_across_dumps_names_the_dump_and_entry(tmp_path):
    """A negative duration is named in the dump's own field and unit (it was reported as
    duration_us -1000.0); an op ending beyond 64-bit ns is seen on the joined table, and the
    error still names the dump file and its entry."""
    dumps = {r: _dump(r) for r in range(4)}
    dumps[2]["entries"][3]["duration_ms"] = -1.0
    d = _write(tmp_path, dumps)
    with pytest.raises(SchemaError, match=r"nccl_trace_rank_2, entries\[3\]\.duration_ms: "
                       r"negative duration \(got -1\.0; expected milliseconds >= 0\)"):
        read_ops(d)
    del dumps[2]["entries"][3]["duration_ms"]  # timed by discovery: completed before started
    entry = dumps[2]["entries"][3]
    entry["time_discovered_started_ns"] = 2_000
    entry["time_discovered_completed_ns"] = 1_000
    (d / "nccl_trace_rank_2").write_text(json.dumps(dumps[2]))
    with pytest.raises(SchemaError, match=r"entries\[3\]\.time_discovered_completed_ns: "
                       r"completed before it started \(got 1000; expected a time at or after "
                       r"time_discovered_started_ns \(2000\)\)"):
        read_ops(d)
    dumps[2]["entries"][3]["duration_ms"] = 1e30
    (d / "nccl_trace_rank_2").write_text(json.dumps(dumps[2]))
    with pytest.raises(SchemaError, match=r"duration too large at .*nccl_trace_rank_2, "
                       r"entries\[3\]"):
        read_ops(d)


def test_the_commands_read_pickled_dumps_when_told_to_trust_them(tmp_path):
    from typer.testing import CliRunner

    from holmes_ml.cli import app

    d = tmp_path / "fr"
    d.mkdir()
    for r in range(4):
        (d / f"nccl_trace_rank_{r}.pkl").write_bytes(pickle.dumps(_dump(r, slow_rank=2)))
    runner = CliRunner()
    refused = runner.invoke(app, ["check", str(d)])
    assert refused.exit_code == 2
    assert "--trust-pickle" in refused.output and "rank_0.pkl" in refused.output
    for command in ("check", "localize", "detect"):
        args = [command, str(d), "--trust-pickle"]
        args += ["--out", str(tmp_path / "scores.parquet")] if command == "detect" else ["--json"]
        out = runner.invoke(app, args)
        assert out.exit_code == 0, (command, out.output)
    assert json.loads(runner.invoke(app, ["check", str(d), "--trust-pickle", "--json"]).stdout)[
        "ranks"] == 4
