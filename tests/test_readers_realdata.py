"""Every real trace in ../shared/realdata parses; counts are checked against independent reads."""

from __future__ import annotations

import collections
import gzip
import json
import re
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from holmes_ml.io import detect_format, read_ops
from holmes_ml.io.bytedance import read_meta
from holmes_ml.topology import Topology

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "realdata"
if not REAL.exists():
    REAL = Path("/work/shared/realdata")
pytestmark = pytest.mark.skipif(not REAL.exists(), reason="realdata not available")


def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory) -> Path:
    tar = REAL / "kineto-param-dlrm-8rank" / "dlrm_kineto.tar.gz"
    if not tar.exists():
        pytest.skip("DLRM traces absent")
    out = tmp_path_factory.mktemp("dlrm")
    with tarfile.open(tar) as tf:
        tf.extractall(out, filter="data")
    return next(p.parent for p in out.rglob("*.json"))


def test_dlrm_eight_ranks_aligned(dlrm_dir):
    files = sorted(dlrm_dir.glob("*.json"))
    assert len(files) == 8
    assert {detect_format(f) for f in files} == {"kineto"}
    ops = read_ops(dlrm_dir)
    # Independent count: NCCL kernels by name in each rank's JSON.
    for f in files:
        ev = _events(f)
        rank = json.loads(f.read_text())["distributedInfo"]["rank"]
        kernels = collections.Counter(
            re.match(r"ncclKernel_([A-Za-z]+)", e["name"]).group(1)
            for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_"))
        mine = ops[ops["rank"] == rank]["op"].value_counts()
        assert mine.get("all_reduce", 0) == kernels["AllReduce"]
        # DLRM's all-to-alls run as SendRecv kernels; the CPU context names them.
        assert mine.get("all_to_all", 0) == kernels["SendRecv"]
    assert ops["rank"].nunique() == 8
    # Aligned: each (group, seq) instance is the same op, run by all 8 ranks.
    per = ops.groupby(["group", "seq"]).agg(n=("rank", "nunique"), ops=("op", "nunique"))
    assert (per["n"] == 8).all() and (per["ops"] == 1).all()
    assert set(ops["group_ranks"]) == {"0 1 2 3 4 5 6 7"}
    # Old-style trace: ts is epoch µs already, so start_ns is in Sept 2023.
    assert pd.Timestamp(int(ops["start_ns"].min()), unit="ns").year == 2023
    assert (ops["clock"] == "gpu").all()
    assert len(Topology.from_ops(ops).groups) == 1


def test_dlrm_archive_reads_like_its_directory(dlrm_dir):
    """``read_ops`` opens the tar.gz as shipped; same table as the extracted directory."""
    from_tar = read_ops(REAL / "kineto-param-dlrm-8rank" / "dlrm_kineto.tar.gz")
    from_dir = read_ops(dlrm_dir)
    key = ["rank", "group", "seq", "op"]
    pd.testing.assert_frame_equal(
        from_tar.sort_values(key).reset_index(drop=True),
        from_dir.sort_values(key).reset_index(drop=True),
    )


def test_hta_2024_trace_groups_and_sizes():
    f = REAL / "kineto-hta" / "nccl_parser_config__nccl_data.json.gz"
    ops = read_ops(f)
    ev = _events(f)
    meta = [e["args"] for e in ev if e.get("name") == "record_param_comms"
            and e.get("args", {}).get("Collective name") in ("allreduce", "broadcast")]
    names = {str(a["Process Group Name"]) for a in meta}
    assert set(ops["group"]) == names
    sizes = {str(a["Process Group Name"]): int(a["Group size"]) for a in meta}
    got = ops.groupby("group")["group_ranks"].first().str.split().str.len().to_dict()
    assert got == sizes
    kernels = collections.Counter(
        e["name"].split("_")[1] for e in ev
        if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_"))
    counts = ops["op"].value_counts()
    assert counts["all_reduce"] == kernels["AllReduce"]
    assert counts["broadcast"] == kernels["Broadcast"]
    # New-style timing: baseTimeNanoseconds shifts ts to epoch (2024).
    assert pd.Timestamp(int(ops["start_ns"].min()), unit="ns").year == 2024
    assert (ops["nbytes"] > 0).all()


def test_gloo_cpu_trace_all_reduce(caplog):
    f = next((REAL / "kineto-hta").glob("cpu_only__rank-34*"))
    with caplog.at_level("WARNING"):
        ops = read_ops(f)
    n = sum(1 for e in _events(f) if e.get("name") == "gloo:all_reduce")
    assert n > 0 and len(ops) == n
    assert set(ops["op"]) == {"all_reduce"} and set(ops["rank"]) == {34}
    assert (ops["clock"] == "cpu").all() and (ops["duration_us"] > 0).all()
    # the job made eleven 300-rank gloo groups; two worker threads ran operations in the window,
    # which cannot say which groups they belong to
    assert set(ops["group"]) == {"default"}
    assert "(rank 34)" in caplog.text and "11 gloo groups in pg_config, 2 threads, 22 needed" \
        in caplog.text, caplog.text


def test_sampled_ranks_parse():
    files = sorted((REAL / "kineto-hta").glob("trace_filter__sampled_rank-*.json.gz"))
    ops = read_ops(files)
    assert sorted(ops["rank"].unique()) == [0, 1]
    for f, rank in zip(files, (0, 1), strict=True):
        ann = collections.Counter(e["name"] for e in _events(f)
                                  if e.get("cat") == "user_annotation"
                                  and e.get("name", "").startswith("nccl:"))
        mine = ops[ops["rank"] == rank]["op"].value_counts()
        assert mine.get("all_reduce", 0) == ann["nccl:all_reduce"]
        assert mine.get("all_to_all", 0) == ann["nccl:all_to_all"]
        assert mine.get("all_gather", 0) == ann["nccl:_all_gather_base"]
    assert len(ops["group_ranks"].iloc[0].split()) == 128  # default group of a 128-rank job


@pytest.mark.parametrize("name", ["AR", "SE", "ST"])
def test_bytedance_traces(name):
    f = REAL / "bytedance-whatif" / f"trace-{name}.parquet"
    assert detect_format(f) == "bytedance"
    meta = read_meta(REAL / "bytedance-whatif" / f"meta-{name}.yaml")
    ops = read_ops(f)
    raw = pd.read_parquet(f)
    # One recorded worker per (dp, stage).
    assert ops["rank"].nunique() == meta["dp_size"] * meta["pp_size"]
    assert meta["world_size"] == meta["dp_size"] * meta["pp_size"] * meta["tp_size"] * meta[
        "dsp_size"]
    optype = raw["optype"].astype(str)
    assert (ops["op"] == "send").sum() == optype.str.endswith("-send").sum()
    assert (ops["op"] == "recv").sum() == optype.str.endswith("-recv").sum()
    assert (ops["op"] == "reduce_scatter").sum() == (optype == "grads-reduce-scatter").sum()
    assert not ops["op"].isin(["forward-compute"]).any()
    # Every send has its recv: same pair group, same seq, peers pointing at each other.
    s = ops[ops["op"] == "send"]
    r = ops[ops["op"] == "recv"]
    m = s.merge(r, left_on=["peer", "rank", "group", "seq"],
                right_on=["rank", "peer", "group", "seq"], how="inner")
    assert len(m) == len(s) == len(r)
    dp = ops[ops["group_kind"] == "dp"]
    assert (dp["group_ranks"].str.split().str.len() == meta["dp_size"]).all()
    assert {"dp", "pp", "tp", "step_compute_us"} <= set(ops.columns)
    assert ops["pp"].max() == meta["pp_size"] - 1
    topo = Topology.from_ops(ops)
    assert set(topo.groups) == set(ops["group"])


def test_bytedance_ar_slow_worker_visible():
    """Ground truth of trace-AR: dp 0 / stage 0 computes ~2x slower than its peers."""
    ops = read_ops(REAL / "bytedance-whatif" / "trace-AR.parquet")
    comp = ops.groupby(["dp", "pp"])["step_compute_us"].median()
    assert comp.idxmax() == (0, 0)
