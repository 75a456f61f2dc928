"""CommOpsLogger hot path: packed row buffer, generated wrappers, dictionary-coded Parquet."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from _gloo import run_workers

from holmes_ml.collect import rank_log_path
from holmes_ml.collect.writer import ARROW_SCHEMA, Coded, RowSink
from holmes_ml.io.readers import read_arrow_stream


def _batch(rng: np.random.Generator, n: int, groups: tuple[str, ...]) -> dict:
    codes = rng.integers(0, len(groups), n)
    zeros = np.zeros(n, dtype=np.int64)
    return {
        "iteration": np.arange(n), "rank": zeros, "op": Coded(zeros, ("all_reduce",)),
        "group": Coded(codes, groups), "seq": np.arange(n), "nbytes": rng.integers(0, 99, n),
        "start_ns": rng.integers(0, 10**12, n), "duration_us": rng.random(n),
        "group_ranks": Coded(codes, tuple(f"0 {i}" for i in range(len(groups)))),
        "group_kind": Coded(codes, groups), "peer": zeros - 1,
        "host": Coded(zeros, ("h",)), "job": Coded(zeros, ("",)),
    }


def test_parquet_dictionary_grows_between_row_groups(tmp_path):
    """Each flush hands over its own (growing) list of group names; the file reads back as
    plain strings with the canonical Arrow schema, row group by row group."""
    rng = np.random.default_rng(7)
    sink = RowSink(tmp_path / "g.parquet")
    want = []
    for k in range(1, 4):
        cols = _batch(rng, 20, tuple(f"g{i}" for i in range(k)))
        sink.write(cols)
        want.append(pd.DataFrame({c: (np.asarray(v.values, dtype=object)[v.codes]
                                      if isinstance(v, Coded) else v) for c, v in cols.items()}))
    sink.close()
    assert pq.read_schema(sink.path).remove_metadata() == ARROW_SCHEMA
    assert pq.ParquetFile(sink.path).metadata.num_row_groups == 3
    got = pd.read_parquet(sink.path)
    pd.testing.assert_frame_equal(got, pd.concat(want, ignore_index=True), check_dtype=False)
    assert sorted(got["group"].unique()) == ["g0", "g1", "g2"]


_WORKER = textwrap.dedent(
    """
    import gc, inspect, json, os, sys, torch, torch.distributed as dist
    from holmes_ml.collect import CommOpsLogger, LoggerConfig
    store, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    orig_sig = list(inspect.signature(dist.all_reduce).parameters)
    res = {}
    with CommOpsLogger(LoggerConfig(out_dir=out, flush_every=4)) as log:
        t = torch.ones(4)
        res["sig"] = list(inspect.signature(dist.all_reduce).parameters) == orig_sig
        dist.all_reduce(t)                                         # positional
        dist.all_reduce(tensor=t, group=None)                      # keywords
        dist.all_reduce(t, dist.ReduceOp.MAX, None, False)         # everything positional
        try:
            dist.all_reduce(t, bogus=1)
        except TypeError as e:
            res["bad_kwarg"] = "bogus" in str(e)
        try:
            dist.all_reduce("not a tensor")
        except Exception:
            res["raised"] = True
        w = dist.all_reduce(torch.ones(2), async_op=True)          # slow path, pending
        dist.all_reduce(torch.ones(3))
        w.wait()
        dist.barrier()
        log.step()
        dist.all_reduce(t)                                         # iteration 1
        log.iteration = 7                                          # set by hand
        dist.all_reduce(t)
        dist.all_reduce(t)
        log.step()
        dist.all_reduce(t)                                         # iteration 8
    # no Python object per logged call survives: the buffer is one bytearray
    with CommOpsLogger(LoggerConfig(out_dir=f"{out}/gc", flush_every=10000)):
        gc.collect()
        gc.disable()
        before = len(gc.get_objects())
        for _ in range(3000):
            dist.all_reduce(t)
        res["gc_growth"] = len(gc.get_objects()) - before
        gc.enable()
    with open(f"{out}/res.json", "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)  # without the interpreter's teardown: see tests/test_io_kineto_torch.py
    """
)


@pytest.mark.torch
def test_hot_path_in_a_gloo_world(tmp_path):
    pytest.importorskip("torch")
    out = run_workers(tmp_path, _WORKER)
    res = json.loads((out / "res.json").read_text())
    assert res["sig"] and res["bad_kwarg"] and res["raised"]
    assert res["gc_growth"] < 300, res  # a tuple per call would leave >= 3000 objects
    df = read_arrow_stream(rank_log_path(out, 0)).to_pandas()  # the default format
    # iteration 0: 3 + async + 1 + barrier (the two failed calls are not rows); then 1 + 2 + 1
    assert len(df) == 10 and (df["duration_us"] >= 0).all()
    assert sorted(df["seq"]) == list(range(len(df)))  # one group: gapless, failures skipped
    # iterations survive flushes every 4 rows although packed rows do not store them
    assert df.sort_values("seq")["iteration"].tolist() == [0] * 6 + [1, 7, 7, 8]
    assert read_arrow_stream(rank_log_path(out / "gc", 0)).num_rows == 3000
    first = df[df["iteration"] == 0].sort_values("seq")
    assert first["op"].tolist() == ["all_reduce"] * 5 + ["barrier"]
    assert first["nbytes"].tolist() == [16, 16, 16, 8, 12, 0]
    # rows of one flush are in call order even when an async row was completed later
    assert first["start_ns"].is_monotonic_increasing
