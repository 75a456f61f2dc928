"""FeatureStream: batch-by-batch features equal one call on the whole log."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.bench.features import synthetic_ops
from holmes_ml.features import FeatureConfig, FeatureStream, build_features, stream_context


@pytest.fixture(scope="module")
def ops() -> pd.DataFrame:
    # longer than the default context (31 iterations), a straggler for 4 of them and rank 3's
    # ops 1.4x longer from iteration 20 on (the lowest level reaches back beyond the history)
    ops = synthetic_ops(tp=4, pp=2, dp=2, iterations=44, seed=2, slow_rank=9,
                        slow_factor=1.5, slow_iterations=(14, 18))
    ops.loc[(ops["rank"] == 3) & (ops["iteration"] >= 20), "duration_us"] *= 1.4
    return ops


@pytest.mark.parametrize("step", [1, 4])
def test_stream_matches_whole_log(ops, step):
    whole = build_features(ops)
    stream = FeatureStream()
    parts = []
    for lo in range(0, 44, step):
        batch = ops[ops["iteration"].between(lo, lo + step - 1)]
        got = stream.update(batch)
        assert got.index.equals(batch.index)
        parts.append(got)
        kept = ops[ops["iteration"] < stream.context_iterations]
        assert stream.context_rows <= len(kept) + len(batch)
    streamed = pd.concat(parts).loc[ops.index]
    exact = [c for c in whole.columns if c != "iter_time_ratio"]
    np.testing.assert_array_equal(streamed[exact].to_numpy(), whole[exact].to_numpy())
    # the iteration-time reference may reach further back than the kept context
    np.testing.assert_allclose(streamed["iter_time_ratio"], whole["iter_time_ratio"], rtol=0.05)
    assert streamed.loc[ops["abnormal"], "hist_z"].mean() > 2
    # the level columns are the whole log's too, and remember the slowdown the history forgot
    late = (ops["rank"] == 3) & (ops["iteration"] >= 34)
    assert streamed.loc[late, "hist_ratio"].median() < 1.1
    assert streamed.loc[late, "level_excess_frac"].median() > 0.2


def test_stream_without_context_has_no_history(ops):
    stream = FeatureStream(FeatureConfig(window=5), context_iterations=0)
    stream.update(ops[ops["iteration"] == 0])
    got = stream.update(ops[ops["iteration"] == 1])
    assert (got["history_len"] == 0).all()
    assert stream.context_rows == 0
    assert FeatureStream().context_iterations == stream_context() == 10 + 20 - 1 + 2
    stream = FeatureStream(FeatureConfig(window=5, level_memory=10))
    assert stream.context_iterations == 22  # the irregularity window dominates
    stream.update(ops[ops["iteration"] <= 3])
    assert stream.context_rows > 0
    stream.reset()
    assert stream.context_rows == 0
    with pytest.raises(ValueError, match="context_iterations"):
        FeatureStream(context_iterations=-1)
