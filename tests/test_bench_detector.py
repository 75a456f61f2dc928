"""Pieces of `holmes bench detector` that can be checked without its 25-minute run."""

from __future__ import annotations

import numpy as np
import pytest

from holmes_ml.bench.detector import _heldout, _per_run_rows, _scores_row


def test_scores_row_per_scale_and_overall():
    truth = np.array([1, 1, 0, 0, 1, 0, 0, 0], dtype=bool)
    pred = np.array([1, 0, 0, 0, 1, 1, 0, 0], dtype=bool)
    scale_of = np.array([64, 64, 64, 64, 256, 256, 256, 256])
    row = _scores_row("m", truth, pred, scale_of, (64, 256))
    # 64: tp 1, fn 1 -> F1 2/3; 256: tp 1, fp 1 -> 2/3; overall tp 2, fp 1, fn 1 -> 2/3
    assert row["method"] == "m"
    assert row["64"] == pytest.approx(0.6667) and row["256"] == pytest.approx(0.6667)
    assert row["all"] == pytest.approx(0.6667) and row["precision"] == pytest.approx(0.6667)
    assert row["mean"] == pytest.approx(0.6667)
    empty = _scores_row("m", truth & False, pred & False, scale_of, (64,))
    assert empty["64"] == 0.0 and empty["all"] == 0.0


def test_scores_row_weights_rows_back_to_their_runs():
    # the 256-GPU run's two normal rows stand for 10 ops each: its one false positive is 10
    truth = np.array([1, 1, 0, 0, 1, 0, 0], dtype=bool)
    pred = np.array([1, 1, 0, 0, 1, 1, 0], dtype=bool)
    scale_of = np.array([64, 64, 64, 64, 256, 256, 256])
    w = np.array([1, 1, 1, 1, 1, 10, 10], dtype=float)
    row = _scores_row("m", truth, pred, scale_of, (64, 256), w)
    # F1 = 2 tp / (2 tp + fp + fn). 64: tp 2 -> 1.0; 256: tp 1, fp 10 -> 2 / 12;
    # pooled: tp 3, fp 10 -> 6 / 16
    assert row["64"] == pytest.approx(1.0) and row["256"] == pytest.approx(2 / 12, abs=1e-4)
    assert row["mean"] == pytest.approx((1 + 2 / 12) / 2, abs=1e-4)
    assert row["all"] == pytest.approx(6 / 16, abs=1e-4)
    assert row["precision"] == pytest.approx(3 / 13, abs=1e-4)


def test_heldout_rotates_fault_kinds_over_scales():
    cfgs = _heldout((64, 256, 1024, 4096, 8192), seed=500, iterations=8)
    assert len(cfgs) == 10
    kinds = [c.faults[0].kind for c in cfgs]
    # two kinds per scale, every kind held out at least twice, persistent then spike
    assert {k: kinds.count(k) for k in set(kinds)} == dict.fromkeys(set(kinds), 2)
    assert len(set(kinds)) == 5
    assert [c.faults[0].pattern for c in cfgs[:2]] == ["persistent", "spike"]
    assert len({c.seed for c in cfgs}) == 10


def test_per_run_rows_name_each_run_and_split_precision_from_recall():
    cfgs = _heldout((64, 256), seed=500, iterations=8)[:3]
    truth = np.array([1, 1, 0, 0, 1, 0, 0, 1], dtype=bool)
    pred = np.array([1, 0, 0, 0, 1, 1, 0, 1], dtype=bool)
    run_of = np.array([0, 0, 0, 0, 1, 1, 1, 2])
    w = np.array([1, 1, 1, 1, 1, 3, 1, 1], dtype=float)
    rows = _per_run_rows(truth, pred, run_of, cfgs, w)
    assert [(r["gpus"], r["fault"], r["pattern"]) for r in rows] == [
        (c.gpus, c.faults[0].kind, c.faults[0].pattern) for c in cfgs]
    # run 0 misses one of two (recall 0.5, no false alarm); run 1's false alarm weighs 3
    assert rows[0]["precision"] == 1.0 and rows[0]["recall"] == 0.5
    assert rows[1]["recall"] == 1.0 and rows[1]["precision"] == 0.25
    assert rows[1]["f1"] == pytest.approx(0.4)
    assert rows[2]["abnormal"] == 1 and rows[2]["f1"] == 1.0
