"""Kineto reader on small synthetic traces: timing styles, seq matching, bad inputs."""

from __future__ import annotations

import gzip
import json

import pytest

from holmes_ml.io import SchemaError, detect_format, read_ops
from holmes_ml.io._common import canonical_op

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
    with pytest.raises(SchemaError, match="rank 1"):
        read_ops(d, format="kineto")


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
