"""HSDP (the sixth parallel dimension): dp split into shard groups and replica groups."""

from __future__ import annotations

import numpy as np
import pytest

from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _cfg(**kw):
    base = dict(gpus=64, model="llama2-7b", tp=2, pp=2, iterations=3, seed=3)
    base.update(kw)
    return SimConfig(**base)


def test_default_is_one_distributed_optimizer_group():
    ops = simulate(_cfg()).ops
    assert "dp_replicate" not in set(ops["group_kind"].astype(str))
    dp = ops[ops["group_kind"].astype(str) == "dp"]
    assert dp["group_ranks"].astype(str).str.split().str.len().eq(16).all()


def test_hsdp_groups_partition_dp():
    res = simulate(_cfg(dp_replicate=4))
    ops = res.ops
    kinds = ops["group_kind"].astype(str)
    shard = ops[kinds == "dp"]
    rep = ops[kinds == "dp_replicate"]
    assert set(shard["op"].astype(str)) == {"reduce_scatter", "all_gather"}
    assert set(rep["op"].astype(str)) == {"all_reduce"}
    # dp = 16 -> 4 replicas of 4 shard ranks; a shard group and a replica group meet in one rank.
    sgroups = {tuple(map(int, g.split())) for g in shard["group_ranks"].astype(str)}
    rgroups = {tuple(map(int, g.split())) for g in rep["group_ranks"].astype(str)}
    assert {len(g) for g in sgroups} == {4} and {len(g) for g in rgroups} == {4}
    for sg in sgroups:
        for rg in rgroups:
            assert len(set(sg) & set(rg)) <= 1
    # every rank is in exactly one shard group and one replica group
    for groups in (sgroups, rgroups):
        flat = np.sort(np.concatenate([np.asarray(g) for g in groups]))
        assert np.array_equal(flat, np.arange(64))
    # the replica all-reduce moves one shard of the gradients
    assert rep["nbytes"].iloc[0] * 4 == shard["nbytes"].iloc[0]
    assert res.config["dp_replicate"] == 4
    assert res.topology.parallel["dp_replicate"] == 4


def test_hsdp_slow_gpu_is_the_late_arrival_of_its_shard_group():
    res = simulate(_cfg(dp_replicate=2, iterations=4,
                        faults=(FaultSpec.parse("gpu_slow:rank=5,severity=1.0,start=1"),)))
    ops = res.ops
    kinds = ops["group_kind"].astype(str)
    late = ops["iteration"] >= 1
    shard = ops[(kinds == "dp") & late & (ops["op"].astype(str) == "reduce_scatter")]
    mine = shard[shard["group_ranks"].astype(str).str.split().apply(lambda g: "5" in g)]
    # the straggler arrives last: its own copy is the shortest, its shard peers' are prolonged
    for _, inst in mine.groupby(["iteration", "seq"]):
        assert inst.loc[inst["duration_us"].idxmin(), "rank"] == 5
        assert inst.loc[inst["rank"] != 5, "abnormal"].all()
    # and the replica all-reduce is still logged with its own group kind
    assert (kinds == "dp_replicate").sum() == 4 * 64  # one per rank per iteration


def test_dp_replicate_must_divide_dp():
    with pytest.raises(ValueError, match="dp_replicate"):
        _cfg(dp_replicate=3)
