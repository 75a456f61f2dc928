"""Pieces of `holmes bench detector` that can be checked without its run of over an hour."""

from __future__ import annotations

import numpy as np
import pytest

from holmes_ml.bench.detector import (
    GRID_KINDS,
    METHODS,
    _grid_rows,
    _heldout,
    _methods,
    _per_run_rows,
    _scores_row,
    choose_methods,
    class_sample,
    kind_grid_scenarios,
)
from holmes_ml.models.training import PRESETS, scenarios


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


def test_class_sample_caps_each_class_and_keeps_a_small_one_whole():
    y = np.r_[np.ones(50, dtype=bool), np.zeros(8, dtype=bool)]
    np.random.default_rng(3).shuffle(y)
    idx = class_sample(y, 20, np.random.default_rng(0))
    assert np.all(np.diff(idx) > 0)  # sorted, no repeats
    assert y[idx].sum() == 20 and (~y[idx]).sum() == 8  # 20 of 50 abnormal, all 8 normal
    assert set(np.flatnonzero(~y)) <= set(idx)
    # the draw is seeded, and another seed draws other abnormal rows
    assert np.array_equal(idx, class_sample(y, 20, np.random.default_rng(0)))
    assert not np.array_equal(idx, class_sample(y, 20, np.random.default_rng(1)))


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


def test_kind_grid_puts_every_kind_and_pattern_at_every_scale_on_seeds_of_its_own():
    cfgs = kind_grid_scenarios((64, 256, 8192), repeats=2, iterations=8)
    cells = [(c.gpus, c.faults[0].pattern, c.faults[0].kind) for c in cfgs]
    assert len(cfgs) == 3 * 2 * len(GRID_KINDS) * 2
    assert set(cells) == {(g, p, k) for g in (64, 256, 8192) for p in ("persistent", "spike")
                          for k in GRID_KINDS}
    assert all(cells.count(c) == 2 for c in set(cells))
    seeds = {c.seed for c in cfgs}
    assert len(seeds) == len(cfgs)
    # no job the detector trains on (any preset at the bundled model's seed 0) or the ten
    # held-out jobs use
    trained = {c.seed for p in PRESETS for c in scenarios(p, seed=0)}
    held = {c.seed for c in _heldout((64, 256, 1024, 4096, 8192), seed=500, iterations=8)}
    assert not seeds & (trained | held)
    assert {c.model for c in cfgs if c.gpus == 64} == {"llama2-13b"}
    assert {c.model for c in cfgs if c.gpus >= 256} == {"llama2-70b"}


def test_grid_rows_pool_each_cell_then_each_pattern_then_each_scale():
    cfgs = kind_grid_scenarios((64, 256), patterns=("persistent",), iterations=8)
    kinds = [c.faults[0].kind for c in cfgs]
    # two rows per job: one abnormal, one normal; the detector catches the slow GPU at 64 GPUs
    # only, and flags the normal row of the 256-GPU host stall (weight 3)
    run_of = np.repeat(np.arange(len(cfgs)), 2)
    truth = np.tile([True, False], len(cfgs))
    pred = np.zeros(len(truth), dtype=bool)
    pred[0] = True  # job 0: 64 GPUs, gpu_slow
    j = next(i for i, c in enumerate(cfgs) if c.gpus == 256 and c.faults[0].kind == "host_stall")
    pred[2 * j + 1] = True
    w = np.ones(len(truth))
    w[2 * j + 1] = 3.0
    rows = _grid_rows(truth, pred, run_of, cfgs, w)
    by = {(r["pattern"], r["fault"]): r for r in rows}
    assert len(rows) == len(set(kinds)) + 2
    assert by[("persistent", "gpu_slow")]["64"] == 1.0
    assert by[("persistent", "gpu_slow")]["256"] == 0.0
    # one of two abnormal rows caught over the scales: precision 1, recall 0.5
    assert by[("persistent", "gpu_slow")]["all"] == pytest.approx(2 / 3, abs=1e-4)
    assert by[("persistent", "host_stall")]["256"] == 0.0
    # 64 GPUs: 1 tp of 5 abnormal -> 2 / (2 + 4); 256 GPUs: no tp, 3 fp -> 0
    assert by[("persistent", "all")]["64"] == pytest.approx(2 / 6, abs=1e-4)
    assert by[("all", "all")]["256"] == 0.0
    # every row: tp 1, fp 3, fn 9 -> 2 / 14
    assert by[("all", "all")]["all"] == pytest.approx(2 / 14, abs=1e-4)


def test_grid_rows_leave_a_cell_without_jobs_empty():
    cfgs = (kind_grid_scenarios((64, 256), patterns=("persistent",), iterations=8)
            + kind_grid_scenarios((64,), patterns=("spike",), iterations=8))
    run_of = np.arange(len(cfgs))
    truth = np.ones(len(cfgs), dtype=bool)
    rows = _grid_rows(truth, truth, run_of, cfgs, np.ones(len(cfgs)))
    spike = [r for r in rows if r["pattern"] == "spike"]
    assert spike and all(r["256"] is None and r["64"] == 1.0 for r in spike)
    assert all(r["256"] == 1.0 for r in rows if r["pattern"] == "persistent")


def test_choose_methods_keeps_bench_order_and_always_the_shipped_method():
    assert list(_methods(quick=True)) == list(METHODS)  # the names cover what runs
    assert choose_methods() == METHODS
    assert choose_methods(("knn", "rf")) == ("lgbm", "rf", "knn")
    assert choose_methods(("lgbm",)) == ("lgbm",)
    with pytest.raises(ValueError, match="'forest'.*lgbm, lgbm-absolute.*iforest"):
        choose_methods(("rf", "forest"))
