"""FeatureStream: batch-by-batch features equal one call on the whole log."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.bench.features import synthetic_ops
from holmes_ml.features import FeatureConfig, FeatureStream, build_features


@pytest.fixture(scope="module")
def ops() -> pd.DataFrame:
    return synthetic_ops(tp=4, pp=2, dp=2, iterations=34, seed=2, slow_rank=9,
                         slow_factor=1.5, slow_iterations=(14, 18))


@pytest.mark.parametrize("step", [1, 4])
def test_stream_matches_whole_log(ops, step):
    whole = build_features(ops)
    stream = FeatureStream()
    parts = []
    for lo in range(0, 34, step):
        batch = ops[ops["iteration"].between(lo, lo + step - 1)]
        got = stream.update(batch)
        assert got.index.equals(batch.index)
        parts.append(got)
        assert stream.context_rows <= len(ops[ops["iteration"] < 23]) + len(batch)
    streamed = pd.concat(parts).loc[ops.index]
    exact = [c for c in whole.columns if c != "iter_time_ratio"]
    np.testing.assert_array_equal(streamed[exact].to_numpy(), whole[exact].to_numpy())
    # the iteration-time reference may reach further back than the kept context
    np.testing.assert_allclose(streamed["iter_time_ratio"], whole["iter_time_ratio"], rtol=0.05)
    assert streamed.loc[ops["abnormal"], "hist_z"].mean() > 2


def test_stream_without_context_has_no_history(ops):
    stream = FeatureStream(FeatureConfig(window=5), context_iterations=0)
    stream.update(ops[ops["iteration"] == 0])
    got = stream.update(ops[ops["iteration"] == 1])
    assert (got["history_len"] == 0).all()
    assert stream.context_rows == 0
    stream = FeatureStream(FeatureConfig(window=5))
    assert stream.context_iterations == 22  # the irregularity window dominates
    stream.update(ops[ops["iteration"] <= 3])
    assert stream.context_rows > 0
    stream.reset()
    assert stream.context_rows == 0
    with pytest.raises(ValueError, match="context_iterations"):
        FeatureStream(context_iterations=-1)
