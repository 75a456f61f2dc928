"""Kineto reader on small synthetic traces: timing styles, seq matching, bad inputs."""

from __future__ import annotations

import gzip
import json

import pytest

from holmes_ml.io import SchemaError, detect_format, read_ops
from holmes_ml.io._common import canonical_op
from holmes_ml.io.inventory import inventory
from holmes_ml.io.kineto import read_kineto
from holmes_ml.pipeline import analyze_paths

BASE_NS = 1_716_000_000_000_000_000


def _trace(rank, ops, new_style=True, with_rank=True, seq=True, steps=True):
    """ops: list of (collective name, nelems, start_us, kernel_dur_us)."""
    ev = []
    if steps:
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1,
                   "tid": 1, "ts": 0.0, "dur": 5000.0})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#8", "pid": 1,
                   "tid": 1, "ts": 5000.0, "dur": 5000.0})
    for i, (name, nelems, ts, kdur) in enumerate(ops):
        args = {"Collective name": name, "Process Group Name": "3",
                "Process Group Ranks": "[0, 1, 2]", "In msg nelems": nelems,
                "Out msg nelems": nelems, "dtype": "BFloat16", "Group size": 3}
        if seq:
            args["Seq"] = i + 10
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                   "ts": ts, "dur": 20.0, "args": args})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                   "tid": 1, "ts": ts + 5, "dur": 5.0, "args": {"correlation": 100 + i}})
        kname = {"allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                 "allgather": "ncclDevKernel_AllGather_RING_LL",
                 "_reduce_scatter_base": "ncclSymDevKernel_ReduceScatter_LL"}[name]
        ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7,
                   "ts": ts + 30, "dur": kdur, "args": {"correlation": 100 + i}})
    doc = {"schemaVersion": 1, "traceEvents": ev,
           "distributedInfo": {"backend": "nccl", "world_size": 3, **({"rank": rank} if
                                                                      with_rank else {})}}
    if new_style:
        doc["baseTimeNanoseconds"] = BASE_NS
    return doc


OPS = [("allreduce", 1000, 100.0, 50.0), ("allgather", 10, 4000.0, 20.0),
       ("_reduce_scatter_base", 64, 6000.0, 30.0)]


def _write(path, doc, gz=False):
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_new_style_timing_seq_and_steps(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    for r in range(3):
        slow = [(n, e, ts + 7 * r, k * (1 + r)) for n, e, ts, k in OPS]
        _write(d / f"rank{r}.pt.trace.json{'.gz' if r else ''}", _trace(r, slow), gz=bool(r))
    assert {detect_format(p) for p in d.iterdir()} == {"kineto"}
    ops = read_ops(d)
    assert len(ops) == 9
    assert sorted(ops["seq"].unique()) == [10, 11, 12]  # the "Seq" argument
    first = ops[(ops["rank"] == 2) & (ops["seq"] == 10)].iloc[0]
    assert first["op"] == "all_reduce" and first["nbytes"] == 2000  # bf16
    assert first["start_ns"] == BASE_NS + (100 + 14 + 30) * 1000
    assert first["duration_us"] == pytest.approx(150.0)
    assert first["group"] == "3" and first["group_ranks"] == "0 1 2"
    assert list(ops[ops["rank"] == 0].sort_values("seq")["iteration"]) == [7, 7, 8]
    assert list(ops[ops["rank"] == 0].sort_values("seq")["op"]) == [
        "all_reduce", "all_gather", "reduce_scatter"]


def test_a_rank_list_cut_by_the_profiler_is_not_taken_for_the_group(tmp_path):
    """PyTorch writes at most 30 members ("[0, 1, ..., 29, ...]"): a 40-rank group's list is
    not its members (rank 35 would be outside them); pg_config's full list is used instead,
    and without it the members are left unknown (the ranks seen logging the group)."""
    cut = "[" + ", ".join(map(str, range(30))) + ", ...]"
    for with_config in (True, False):
        doc = _trace(35, OPS[:1])
        doc["distributedInfo"]["world_size"] = 40
        doc["traceEvents"][2]["args"]["Process Group Ranks"] = cut
        if with_config:
            doc["distributedInfo"]["pg_config"] = [{"pg_name": "3", "ranks": list(range(40))}]
        ops = read_ops(_write(tmp_path / f"rank35-{with_config}.json", doc))
        want = " ".join(map(str, range(40))) if with_config else ""
        assert ops["group_ranks"].tolist() == [want]
    # a rank whose trace cannot tell takes the members another rank's trace gives
    doc = _trace(0, OPS[:1])
    doc["distributedInfo"]["world_size"] = 40
    doc["traceEvents"][2]["args"]["Process Group Ranks"] = cut
    ops = read_ops([tmp_path / "rank35-True.json", _write(tmp_path / "rank0.json", doc)])
    assert set(ops["group_ranks"]) == {" ".join(map(str, range(40)))}


def test_send_recv_peers_come_from_the_profilers_src_and_dst_rank(tmp_path):
    """torch records the other end of a send/recv as "Dst Rank"/"Src Rank" (a global rank):
    it becomes the peer, so pipeline chains can be followed in Kineto traces too."""
    d = tmp_path / "t"
    d.mkdir()
    for rank, op, key, other in ((0, "send", "Dst Rank", 2), (2, "recv", "Src Rank", 0)):
        doc = _trace(rank, OPS[:1], seq=False)
        args = doc["traceEvents"][2]["args"]
        args.update({"Collective name": op, key: other, "Process Group Ranks": "[0, 2]",
                     "Process Group Name": "pp-0", "Group size": 2})
        doc["traceEvents"][4]["name"] = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
        _write(d / f"rank{rank}.json", doc)
    ops = read_ops(d).set_index("rank")
    assert (ops.loc[0, "op"], ops.loc[0, "peer"]) == ("send", 2)
    assert (ops.loc[2, "op"], ops.loc[2, "peer"]) == ("recv", 0)


def test_old_style_order_matching_and_rank_from_name(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    for r in range(2):
        doc = _trace(r, [(n, e, 1.7e15 + ts, k) for n, e, ts, k in OPS], new_style=False,
                     with_rank=False, seq=False, steps=False)
        _write(d / f"worker{r}_step_3.json", doc)
    ops = read_ops(d)
    assert sorted(ops["rank"].unique()) == [0, 1]
    assert (ops["iteration"] == 0).all()
    per = ops.groupby("seq")["op"].agg(["nunique", "first", "size"])
    assert (per["nunique"] == 1).all() and (per["size"] == 2).all()
    assert list(per["first"]) == ["all_reduce", "all_gather", "reduce_scatter"]
    assert ops["start_ns"].min() == int(1.7e15 * 1000) + 130_000


def test_two_traces_same_rank(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    _write(d / "a.json", _trace(1, OPS))
    _write(d / "b.json", _trace(1, OPS))
    with pytest.raises(SchemaError, match="rank 1 .* and its step\\(s\\) 7-8"):
        read_ops(d, format="kineto")


def test_the_windows_of_a_repeating_profiler_schedule_are_read_together(tmp_path):
    """torch.profiler's schedule(repeat=2) writes a trace per window and rank: 'two traces
    claim rank 0' refused what the README says holmes reads (a few stretches of a run)."""
    d = tmp_path / "t"
    d.mkdir()
    for rank in range(3):
        _write(d / f"rank{rank}.1.json", _trace(rank, OPS))
        later = _trace(rank, OPS)
        for ev in later["traceEvents"]:
            ev["ts"] += 100_000.0
            ev["name"] = ev["name"].replace("#7", "#17").replace("#8", "#18")
        _write(d / f"rank{rank}.2.json", later)
    ops = read_ops(d, format="kineto")
    assert sorted(ops["iteration"].unique()) == [7, 8, 17, 18]
    assert len(ops) == 2 * 3 * len(OPS)
    # each instance's copies are matched across ranks within its window
    assert (ops.groupby(["group", "seq"])["rank"].nunique() == 3).all()


def test_truncated_gz_trace(tmp_path):
    data = gzip.compress(json.dumps(_trace(0, OPS)).encode())
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="kineto")
    assert "rank0.json.gz" in str(err.value)


def test_truncated_plain_trace_names_line(tmp_path):
    text = json.dumps(_trace(0, OPS), indent=1)
    p = tmp_path / "rank0.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(SchemaError) as err:
        read_ops(p, format="kineto")
    assert "rank0.json" in str(err.value) and "line" in str(err.value)


def test_unknown_collective_name(tmp_path):
    doc = _trace(0, OPS)
    doc["traceEvents"][2]["args"]["Collective name"] = "allmagic"
    p = _write(tmp_path / "rank0.json", doc)
    with pytest.raises(SchemaError) as err:
        read_ops(p)
    assert "rank0.json" in str(err.value) and "allmagic" in str(err.value)
    assert "Collective name" in str(err.value)


def test_missing_rank_everywhere(tmp_path):
    p = _write(tmp_path / "trace.json", _trace(0, OPS, with_rank=False))
    with pytest.raises(SchemaError, match="distributedInfo.rank"):
        read_ops(p, format="kineto")


def test_canonical_op_spellings():
    assert canonical_op("nccl:_all_gather_base") == "all_gather"
    assert canonical_op("allgather_into_tensor_coalesced") == "all_gather"
    assert canonical_op("_reduce_scatter_base") == "reduce_scatter"
    assert canonical_op("gloo:all_reduce") == "all_reduce"
    assert canonical_op("c10d::alltoall_base_") == "all_to_all"
    assert canonical_op("not_a_collective") is None
    # ProcessGroupNCCL / gloo spellings seen in real profiles and dumps
    assert [canonical_op(n) for n in ("nccl:all_reduce_barrier", "nccl:_broadcast_oop",
                                      "nccl:_reduce_oop", "reduce_scatter_v", "allgather_v",
                                      "monitored_barrier")] == [
        "barrier", "broadcast", "reduce", "reduce_scatter", "all_gather", "barrier"]


def test_order_matching_tolerates_interleaving(tmp_path, caplog):
    """Without "Seq", rank 1 issues the two collectives of a step in the other order."""
    d = tmp_path / "t"
    d.mkdir()
    swapped = [("allgather", 10, 100.0, 20.0), ("allreduce", 1000, 400.0, 50.0),
               OPS[2]]
    _write(d / "rank0.json", _trace(0, OPS, seq=False))
    _write(d / "rank1.json", _trace(1, swapped, seq=False))
    _write(d / "rank2.json", _trace(2, OPS[:2], seq=False))  # lost its last op
    with caplog.at_level("WARNING"):
        ops = read_ops(d)
    per = ops.groupby("seq").agg(ops=("op", "nunique"), n=("rank", "nunique"),
                                 size=("nbytes", "nunique"))
    assert (per["ops"] == 1).all() and (per["size"] == 1).all()
    assert list(per["n"]) == [3, 3, 2]
    assert "missing on some ranks" in caplog.text


# --- Malformed traces: each is refused with a SchemaError naming file, field path and problem.
# _trace(0, OPS) holds ProfilerStep#7/#8 at traceEvents[0]/[1], then per op i the
# record_param_comms span at [2 + 3i], its cudaLaunchKernel at [3 + 3i] and its NCCL kernel
# at [4 + 3i].


def _set(*keys, value):
    """A mutation setting ``doc[keys[0]][keys[1]]... = value``."""
    def mutate(doc):
        obj = doc
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value
    return mutate


def _drop(*keys):
    """A mutation deleting ``doc[keys[0]]...[keys[-1]]``."""
    def mutate(doc):
        obj = doc
        for k in keys[:-1]:
            obj = obj[k]
        del obj[keys[-1]]
    return mutate


def _old_style_dims(doc):
    """The first op sized by old-style Input Dims with a non-numeric dimension."""
    args = doc["traceEvents"][2]["args"]
    del args["In msg nelems"], args["Out msg nelems"]
    args.update({"Input Dims": [["a", 4]], "Input type": ["float"]})


EV = "traceEvents"
MALFORMED = [
    pytest.param(_set("distributedInfo", value=[0]),
                 r"distributedInfo: wrong type \(got 'list'; expected a JSON object",
                 id="distinfo-list"),
    pytest.param(_set(EV, 2, "args", value=[1]),
                 r"traceEvents\[2\]\.args: wrong type \(got 'list'", id="args-list"),
    pytest.param(_set(EV, 0, "name", value=7),
                 r"traceEvents\[0\]\.name: wrong type \(got 'int'; expected a string",
                 id="name-int"),
    pytest.param(_set(EV, 0, "ts", value=None), r"traceEvents\[0\]\.ts: missing",
                 id="step-ts-null"),
    pytest.param(_set(EV, 4, "ts", value=float("nan")),
                 r"traceEvents\[4\]\.ts: not a number \(got nan", id="kernel-ts-nan"),
    pytest.param(_set(EV, 4, "ts", value=10**400), r"traceEvents\[4\]\.ts: not a number",
                 id="kernel-ts-huge-int"),
    pytest.param(_set(EV, 4, "ts", value=1e300),
                 r"traceEvents\[4\]\.ts: start time out of range \(got 1e\+300",
                 id="kernel-ts-1e300"),
    pytest.param(_set(EV, 2, "tid", value=[1]),
                 r"traceEvents\[2\]\.tid: wrong type \(got 'list'", id="cpu-tid-list"),
    pytest.param(_set(EV, 3, "tid", value={"a": 1}),
                 r"traceEvents\[3\]\.tid: wrong type \(got 'dict'", id="launch-tid-dict"),
    pytest.param(_set(EV, 3, "args", "correlation", value=[1]),
                 r"traceEvents\[3\]\.args\.correlation: not an integer", id="correlation-list"),
    pytest.param(_set("distributedInfo", "rank", value="abc"),
                 r"distributedInfo\.rank: not an integer \(got 'abc'", id="rank-str"),
    pytest.param(_set("distributedInfo", "rank", value=1.7),
                 r"distributedInfo\.rank: not an integer \(got 1\.7", id="rank-float"),
    pytest.param(_set("distributedInfo", "rank", value=True),
                 r"distributedInfo\.rank: not an integer \(got True", id="rank-bool"),
    pytest.param(_set("distributedInfo", "rank", value=5),
                 r"distributedInfo\.rank: rank not below the world size \(got 5; expected a rank "
                 r"in \[0, 2\]", id="rank-beyond-world"),
    pytest.param(_set("distributedInfo", "world_size", value=0),
                 r"distributedInfo\.world_size: out of range \(got 0", id="world-0"),
    # Far too large to be real (a list of that many ranks is built for ops on the default
    # group); 2**20 + 1 keeps the test fast even before the bound existed.
    pytest.param(_set("distributedInfo", "world_size", value=(1 << 20) + 1),
                 r"distributedInfo\.world_size: out of range \(got 1048577; expected an integer "
                 r"in \[1, 1048576\]", id="world-huge"),
    pytest.param(_set("distributedInfo", "pg_config", value=5),
                 r"distributedInfo\.pg_config: wrong type \(got 'int'; expected a JSON list",
                 id="pg-config-int"),
    pytest.param(_set("baseTimeNanoseconds", value="abc"),
                 r"baseTimeNanoseconds: not an integer \(got 'abc'", id="base-str"),
    pytest.param(_set(EV, 2, "args", "Seq", value="abc"),
                 r"traceEvents\[2\]\.args\.Seq: not an integer \(got 'abc'", id="seq-str"),
    pytest.param(_set(EV, 2, "args", "In msg nelems", value=-5),
                 r"traceEvents\[2\]\.args\['In msg nelems'\]: out of range \(got -5",
                 id="nelems-negative"),
    pytest.param(_set(EV, 2, "args", "dtype", value=["BFloat16"]),
                 r"traceEvents\[2\]\.args\.dtype: wrong type \(got 'list'", id="dtype-list"),
    pytest.param(_set(EV, 2, "args", "Process Group Ranks", value="[0, 1, 7]"),
                 r"traceEvents\[2\]\.args\['Process Group Ranks'\]: rank out of range \(got 7",
                 id="group-rank-beyond-world"),
    pytest.param(_set(EV, 2, "args", "Process Group Name", value={"x": 1}),
                 r"traceEvents\[2\]\.args\['Process Group Name'\]: wrong type \(got 'dict'",
                 id="group-name-dict"),
    pytest.param(_old_style_dims,
                 r"traceEvents\[2\]\.args\['Input Dims'\]\[0\]\[0\]: not an integer \(got 'a'",
                 id="input-dims-str"),
    pytest.param(_set(EV, 0, "name", value="ProfilerStep#" + "9" * 30),
                 r"traceEvents\[0\]\.name: step number too large", id="step-number-huge"),
    pytest.param(lambda doc: doc[EV].append(5),
                 r"traceEvents\[11\]: wrong type \(got 'int'; expected a JSON object",
                 id="event-not-object"),
    # Formerly accepted silently: clamped to 0, or the event dropped / its duration read as 0.
    pytest.param(_set(EV, 4, "dur", value=-500.0),
                 r"traceEvents\[4\]\.dur: negative duration \(got -500\.0",
                 id="kernel-dur-negative"),
    pytest.param(_drop(EV, 4, "ts"), r"traceEvents\[4\]\.ts: missing", id="kernel-ts-missing"),
    pytest.param(_drop(EV, 4, "dur"), r"traceEvents\[4\]\.dur: missing", id="kernel-dur-missing"),
    pytest.param(_drop(EV, 2, "ts"), r"traceEvents\[2\]\.ts: missing", id="cpu-ts-missing"),
    pytest.param(_drop(EV, 2, "dur"), r"traceEvents\[2\]\.dur: missing", id="cpu-dur-missing"),
]


@pytest.mark.parametrize(("mutate", "match"), MALFORMED)
def test_malformed_trace_refused(tmp_path, mutate, match):
    doc = _trace(0, OPS)
    mutate(doc)
    p = _write(tmp_path / "rank0.json", doc)
    with pytest.raises(SchemaError, match=r"rank0\.json, " + match):
        read_kineto([p])


def test_ignored_events_are_not_checked(tmp_path):
    """Events the reader does not use may be odd: a compute op without ts, a memcpy with list
    args, a counter event."""
    doc = _trace(0, OPS)
    doc[EV] += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": [1], "args": [2]},
                {"ph": "X", "cat": "gpu_memcpy", "name": 3, "ts": None},
                {"ph": "C", "name": "mem", "ts": "x", "args": {"bytes": 1}}]
    ops = read_kineto([_write(tmp_path / "rank0.json", doc)])
    assert len(ops) == 3


def test_world_sizes_disagree(tmp_path):
    sizes = {0: 3, 1: 7}
    for r, size in sizes.items():
        doc = _trace(r, OPS)
        doc["distributedInfo"]["world_size"] = size
        _write(tmp_path / f"rank{r}.json", doc)
    with pytest.raises(SchemaError, match=r"rank1\.json, distributedInfo\.world_size: world size "
                       r"disagrees with .*rank0\.json \(got 7; expected the same world_size "
                       r"in every trace of one job \(3 in .*rank0\.json"):
        read_kineto(sorted(tmp_path.glob("*.json")))


def test_rank_beyond_world_of_another_trace(tmp_path):
    """A trace without world_size still has to fit the world the other traces state."""
    _write(tmp_path / "rank0.json", _trace(0, OPS))
    doc = _trace(5, OPS)
    del doc["distributedInfo"]["world_size"]
    _write(tmp_path / "rank5.json", doc)
    with pytest.raises(SchemaError, match=r"rank5\.json, rank: rank not below the world size "
                       r"\(got 5; expected a rank in \[0, 2\] \(world_size 3 in .*rank0\.json"):
        read_kineto(sorted(tmp_path.glob("*.json")))


# --- gloo: the profiler does not say which process group ran a gloo:<op>; each group has
# its own two worker threads, started in the order the groups were created (pg_config's order).


def _gloo_trace(rank, groups, threads, default_backend="cpu:gloo,cuda:gloo", sends=(),
                dst="3"):
    """A 4-rank gloo trace of ``rank``: ``groups`` is pg_config's (name, members) pairs (the
    first one the default group), ``threads`` maps a worker thread id to the start times (µs)
    of the ``gloo:all_reduce`` operations it ran, 100 µs each; ``sends``: start times of
    ``gloo:send`` operations on the main thread (tid 1), which is where gloo runs them, inside
    their ``c10d::send`` dispatch to group rank ``dst``."""
    config = [{"pg_name": name, "pg_desc": "default_pg" if j == 0 else "undefined",
               "backend_config": default_backend if j == 0 else "cpu:gloo,cuda:gloo",
               "pg_size": len(m), "ranks": m} for j, (name, m) in enumerate(groups)]
    ev = [{"ph": "X", "cat": "user_annotation", "name": name, "pid": 1,
           "tid": tid, "ts": ts, "dur": 100.0,
           "args": {"Input type": ["float"], "Input Dims": [[1024]]}}
          for name, tid, starts in [*(("gloo:all_reduce", t, s) for t, s in threads.items()),
                                    ("gloo:send", 1, sends)] for ts in starts]
    ev += [{"ph": "X", "cat": "cpu_op", "name": "c10d::send", "pid": 1, "tid": 1,
            "ts": ts - 1.0, "dur": 102.0, "args": {"Concrete Inputs": ["", "", dst, "0"]}}
           for ts in sends]
    return {"traceEvents": ev, "baseTimeNanoseconds": BASE_NS,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 4,
                                "pg_count": 3, "pg_config": config}}


def test_gloo_operations_go_to_the_group_whose_worker_threads_ran_them(tmp_path, caplog):
    """World group threads 20, 21 (created first), the pair's 35, 31 (later; ids need not be
    adjacent): per step, one world all_reduce and two in the pair."""
    for r in range(4):
        # pg_config lists the groups this rank is in: new_group([0, 1]) is "1", [2, 3] is "2"
        pair = ("1", [0, 1]) if r < 2 else ("2", [2, 3])
        t0 = 100 * r  # thread ids are per process
        _write(tmp_path / f"rank{r}.json", _gloo_trace(r, [("0", [0, 1, 2, 3]), pair], {
            20: [0.0], 21: [1000.0], 30 + t0 + 5: [300.0, 1500.0], 31 + t0: [600.0, 1800.0]}))
    with caplog.at_level("WARNING"):
        ops = read_ops(tmp_path)
    assert "gloo" not in caplog.text and "gloo_groups_merged_ranks" not in ops.attrs
    groups = ops.groupby("group", observed=True).agg(
        members=("group_ranks", "first"), ranks=("rank", lambda s: sorted(set(s))),
        n=("rank", "size"), instances=("seq", "nunique"))
    assert groups.to_dict("index") == {
        "default": {"members": "0 1 2 3", "ranks": [0, 1, 2, 3], "n": 8, "instances": 2},
        "1": {"members": "0 1", "ranks": [0, 1], "n": 8, "instances": 4},
        "2": {"members": "2 3", "ranks": [2, 3], "n": 8, "instances": 4}}
    # an instance is one operation of both members, in the same step
    per = ops.groupby(["group", "seq"], observed=True)
    assert (per["rank"].nunique() == per["group_ranks"].first().str.split().str.len()).all()
    assert (per["start_ns"].agg(lambda s: s.max() - s.min()) == 0).all()


def test_a_gloo_send_on_the_main_thread_is_not_taken_for_a_worker_thread(tmp_path, caplog):
    """Rank 0 of the job above also sends: gloo runs a send on the calling thread, a fifth
    thread in the trace, which the grouping leaves out (and the send in the default group)."""
    _write(tmp_path / "rank0.json", _gloo_trace(0, [("0", [0, 1, 2, 3]), ("1", [0, 1])], {
        20: [0.0], 21: [1000.0], 35: [300.0, 1500.0], 31: [600.0, 1800.0]},
        sends=[700.0, 1900.0]))
    with caplog.at_level("WARNING"):
        ops = read_ops(tmp_path)
    assert "gloo" not in caplog.text
    per = ops.groupby(["op", "group", "peer"], observed=True).size().to_dict()
    # its destination is rank 3 of the send's group, which the trace does not name: no peer
    assert per == {("all_reduce", "default", -1): 2, ("all_reduce", "1", -1): 4,
                   ("send", "default", -1): 2}


def test_a_gloo_send_on_the_world_takes_its_peer_from_its_dispatch(tmp_path):
    """With the world its only gloo group, a rank's send goes over the world: the dispatch's
    destination is a global rank. A destination beyond the world is refused."""
    _write(tmp_path / "rank0.json", _gloo_trace(0, [("0", [0, 1, 2, 3])], {
        20: [0.0], 21: [1000.0]}, sends=[300.0, 1500.0]))
    ops = read_ops(tmp_path)
    assert ops.groupby(["op", "peer"]).size().to_dict() == {("all_reduce", -1): 2,
                                                           ("send", 3): 2}
    _write(tmp_path / "rank0.json", _gloo_trace(0, [("0", [0, 1, 2, 3])], {20: [0.0]},
                                                sends=[300.0], dst="4"))
    with pytest.raises(SchemaError, match=r"rank0\.json, traceEvents\[\d+\]\.args\['Concrete "
                       r"Inputs'\]\[2\].*got 4"):
        read_ops(tmp_path)


def test_gloo_groups_that_cannot_be_told_apart_are_one_world_group_and_a_warning(
        tmp_path, caplog):
    """Rank 0's trace shows three worker threads for its two gloo groups (one of the world's
    idle in the window, or a custom thread count): nothing is guessed."""
    _write(tmp_path / "rank0.json", _gloo_trace(0, [("0", [0, 1, 2, 3]), ("1", [0, 1])], {
        20: [0.0, 1000.0], 30: [300.0, 1500.0], 31: [600.0, 1800.0]}))
    with caplog.at_level("WARNING"):
        ops = read_ops(tmp_path)
    assert set(ops["group"]) == {"default"} and len(ops) == 6
    assert ("gloo operations of 1 trace(s) (rank 0) are read as one communicator of the "
            "whole world" in caplog.text and "2 gloo groups in pg_config, 3 threads, 4 needed"
            in caplog.text), caplog.text
    # and where a script reads JSON instead of stderr: holmes check and the verdict's note
    checks = inventory(ops)["checks"]
    assert {"ok": False, "what": "the gloo operations of 1 rank(s) are read as one world "
            "communicator: their profiler traces do not tell which process group ran each "
            "(see the warning above)"} in checks
    note = analyze_paths([tmp_path], model="rule").note
    assert note is not None and "gloo operations of 1 rank(s) were read as one group" in note


def test_the_one_gloo_group_beside_an_nccl_default_group_runs_every_gloo_operation(tmp_path):
    _write(tmp_path / "rank2.json", _gloo_trace(2, [("0", [0, 1, 2, 3]), ("1", [2, 3])], {
        40: [0.0, 1000.0]}, default_backend="cuda:nccl"))
    ops = read_ops(tmp_path)
    assert set(ops["group"]) == {"1"} and set(ops["group_ranks"]) == {"2 3"}


def test_members_disagreeing_across_traces_name_each_trace_and_event(tmp_path):
    for r in range(3):
        doc = _trace(r, OPS)
        if r == 1:
            doc["traceEvents"][2]["args"]["Process Group Ranks"] = "[0, 1]"
            doc["traceEvents"][2]["args"]["Group size"] = 2
        _write(tmp_path / f"rank{r}.json", doc)
    with pytest.raises(SchemaError, match=r"disagree on its size at .*rank1\.json, "
                       r"traceEvents\[2\] .*as in .*rank0\.json, traceEvents\[2\]"):
        read_ops(tmp_path)


def test_unsized_ops_and_unnumbered_steps_are_said_not_merged_quietly(tmp_path, caplog):
    doc = _trace(0, OPS)
    for e in doc["traceEvents"]:
        if e["name"] == "record_param_comms":
            e["args"]["dtype"] = "Quaternion"
        if e["name"] == "ProfilerStep#8":
            e["name"] = "ProfilerStep#eight"
    _write(tmp_path / "rank0.json", doc)
    with caplog.at_level("WARNING"):
        ops = read_kineto([tmp_path / "rank0.json"])
    assert (ops["nbytes"] == 0).all()
    assert "3 op(s) count elements of dtype 'Quaternion', whose size is not known" in caplog.text
    assert "1 ProfilerStep span(s) not numbered (first: 'ProfilerStep#eight'" in caplog.text


def test_a_name_that_is_not_utf8_is_read_with_a_warning_naming_the_byte(tmp_path, caplog):
    # a kernel name cut mid-character: the trace is read, the name gets U+FFFD, and a warning
    # says where (it was replaced without a word)
    doc = _trace(0, OPS)
    doc["traceEvents"][-1]["name"] = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL_XX"
    raw = json.dumps(doc, indent=1).encode().replace(b"LL_XX", b"LL_\xe2\x82")
    p = tmp_path / "rank0.pt.trace.json"
    p.write_bytes(raw)
    with caplog.at_level("WARNING", logger="holmes_ml.io._common"):
        ops = read_kineto(p)
    assert len(ops) == len(OPS)
    line = raw[:raw.index(b"\xe2\x82")].count(b"\n") + 1
    assert f"rank0.pt.trace.json, line {line}: bytes that are not UTF-8 (the first 0xe2" \
        in caplog.text


def test_the_not_utf8_warning_counts_past_a_byte_order_mark(tmp_path, caplog):
    from holmes_ml.io._common import decode_text

    raw = b'\xef\xbb\xbf{"a": 1}\n\xff"b"'
    with caplog.at_level("WARNING", logger="holmes_ml.io._common"):
        assert decode_text(raw, "x.json") == '{"a": 1}\n\ufffd"b"'
    assert "x.json, line 2: bytes that are not UTF-8 (the first 0xff at offset 12)" in caplog.text


def test_a_step_number_seen_twice_is_said_not_merged_quietly(tmp_path, caplog):
    doc = _trace(0, OPS)
    _write(tmp_path / "ok.json", doc)
    with caplog.at_level("WARNING"):
        read_kineto([tmp_path / "ok.json"])
    assert "more than once" not in caplog.text
    for e in doc["traceEvents"]:
        if e["name"] == "ProfilerStep#8":
            e["name"] = "ProfilerStep#7"  # a restarted profiler numbering again
    _write(tmp_path / "rank0.json", doc)
    with caplog.at_level("WARNING"):
        ops = read_kineto([tmp_path / "rank0.json"])
    assert set(ops["iteration"]) == {7}
    assert "1 ProfilerStep number(s) appear more than once (first: ProfilerStep#7, 2 times)" \
        in caplog.text


# --- A rank whose profiler started later: ProfilerStep#N counts the steps since *that rank's*
# profiler was created, so the ranks number one training step differently.


def _late_profiler_traces(d, late, slow, extra=4, steps=40, fault_from=25, seq=False,
                          skew_us=0.0):
    """Two gloo ranks run ``steps`` training steps of three all_reduces (40 ms a step); rank
    ``late`` creates its profiler ``extra`` steps after the other, so its ProfilerStep#N is
    step N + extra, and starting it stalls rank ``late`` for 3 s (the other one's first
    all_reduce of step ``extra`` waits that long). From step ``fault_from`` rank ``slow``
    arrives 30 ms late at the first all_reduce of each step. ``seq``: the operations carry a
    "Seq" argument (their position in the group, as NCCL records it); ``skew_us``: rank
    ``late``'s clock runs this far ahead."""
    events: dict[int, list] = {0: [], 1: []}
    t, n = 0.0, 0
    for step in range(steps):
        slowed = step >= fault_from
        for rank in (0, 1):
            first = step - extra if rank == late else step
            if first < 1:
                continue  # not recording yet (warm-up, then ProfilerStep#0 is not recorded)
            skew = skew_us if rank == late else 0.0
            events[rank].append({"ph": "X", "cat": "user_annotation",
                                 "name": f"ProfilerStep#{first}", "pid": 1, "tid": 1,
                                 "ts": t + skew, "dur": 39_000.0 + 30_000.0 * slowed})
        stall = 3e6 if step == extra else 0.0
        for k in range(3):
            start = t + 5_000.0 + 10_000.0 * k + 30_000.0 * slowed * (k > 0)
            for rank in (0, 1):
                if (rank == late and step < extra + 1) or (rank != late and step < 1):
                    continue
                late_by = 30_000.0 * (slowed and k == 0 and rank == slow)
                wait = 30_000.0 * (slowed and k == 0 and rank != slow)
                held = stall if k == 0 and rank != late else 0.0
                args = {"Input type": ["float"], "Input Dims": [[1024]]}
                if seq:
                    args["Seq"] = n
                events[rank].append({
                    "ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1,
                    "tid": 20, "ts": start + late_by + (skew_us if rank == late else 0.0),
                    "dur": 1_000.0 + 3.0 * ((step * 7 + k) % 5) + wait + held, "args": args})
            n += 1
        t += 40_000.0 + 30_000.0 * slowed + (stall if step == extra else 0.0)
    for rank in (0, 1):
        _write(d / f"rank{rank}.json", {
            "traceEvents": events[rank], "baseTimeNanoseconds": BASE_NS,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2,
                                "pg_config": [{"pg_name": "0", "ranks": [0, 1],
                                               "backend_config": "cpu:gloo,cuda:gloo"}]}})
    return d


@pytest.mark.parametrize("late", [0, 1])
def test_a_rank_whose_profiler_started_later_is_read_on_the_same_steps(tmp_path, caplog, late):
    """Rank ``late``'s ProfilerStep#1 is step 5 of the job: its steps are renumbered to match
    (by the time its collectives end, which is when the other rank's copies end too), so that
    an instance is one operation of both ranks; the steps only the other rank recorded are left
    out, and with them the wait for the late rank's profiler to start."""
    _late_profiler_traces(tmp_path, late=late, slow=1 - late)
    with caplog.at_level("WARNING"):
        ops = read_ops(tmp_path, format="kineto")
    assert f"shifted to match the rank whose profiler started first: rank {late} by +4" \
        in caplog.text
    assert "step(s) 1-4 are in the traces of some ranks only" in caplog.text
    assert "missing on some ranks" not in caplog.text
    assert ops.groupby("rank")["iteration"].agg(["min", "max"]).to_dict("list") == {
        "min": [5, 5], "max": [39, 39]}
    per = ops.groupby(["iteration", "group", "seq"])
    assert (per["rank"].nunique() == 2).all() and len(per) == 35 * 3
    end = ops["start_ns"] + (ops["duration_us"] * 1000).round().astype("int64")
    assert (end.groupby([ops["iteration"], ops["seq"]]).agg(lambda s: s.max() - s.min())
            == 0).all()
    assert ops["duration_us"].max() < 1e5  # the 3 s wait for the profiler to start is out
    # said where a script sees it too: holmes check
    assert {k: ops.attrs[k] for k in ("kineto_renumbered_ranks", "kineto_steps_left_out")} \
        == {"kineto_renumbered_ranks": 1, "kineto_steps_left_out": 4}
    checks = inventory(ops)["checks"]
    assert {"ok": True, "what": "the profiler traces of 1 rank(s) number the steps from another "
            "start: renumbered to match the others (see the warning above)"} in checks
    assert any(not c["ok"] and c["what"].startswith("4 step(s) are in some ranks' profiler")
               for c in checks), checks


def test_steps_are_matched_by_seq_when_the_traces_carry_it(tmp_path, caplog):
    """With "Seq" the same operation is known on both ranks whatever the clocks say: rank 1's
    clock 0.5 s ahead (more than a step) does not move its steps off the right ones."""
    _late_profiler_traces(tmp_path, late=1, slow=0, seq=True, skew_us=500_000.0)
    with caplog.at_level("WARNING"):
        ops = read_ops(tmp_path, format="kineto")
    assert "rank 1 by +4" in caplog.text
    assert (ops.groupby("seq")["iteration"].nunique() == 1).all()
    assert (ops.groupby("seq")["rank"].nunique() == 2).all()


@pytest.mark.parametrize("late,slow", [(1, 0), (1, 1), (0, 1)])
def test_the_straggler_is_named_whichever_rank_started_its_profiler_later(tmp_path, late,
                                                                          slow):
    """The job above localized: the rank that slowed down from step 25 is named, not the rank
    whose profiler started later (whose start the other rank waited 3 s for)."""
    _late_profiler_traces(tmp_path, late=late, slow=slow)
    verdict = analyze_paths([tmp_path], format="kineto", model="rule")
    assert verdict.candidates, verdict
    assert list(verdict.candidates[0].ranks) == [slow]
    assert verdict.irregular_iterations and min(verdict.irregular_iterations) >= 25
    # the verdict says the steps were renumbered and four left out
    assert "the profiler traces of 1 rank(s) number the job's steps differently" in verdict.note
    assert "4 step(s) that only some ranks' profiler traces hold were left out" in verdict.note
