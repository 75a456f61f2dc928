"""The array cores of a node's summary against the pandas group-bys and frames they replaced:
the same values to the last bit, on a simulated job, on its hosts' parts and on the edge cases
(no rows, one row, rows out of order, compute times missing, too few regular rows)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.io.schema import checked, without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.localize.rules import iteration_spans_of
from holmes_ml.pipeline import (
    _group_sizes,
    _groups_by_text,
    _groups_of,
    _irregular,
    _is_p2p,
    _median_mad,
    _medians_by,
    _op_classes,
    _rank_spans,
    _transfer_scores,
    _warn_far_clocks,
    iteration_monitor,
    per_host,
)
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


def _rank_spans_groupby(ops: pd.DataFrame) -> pd.DataFrame:
    end = ops["start_ns"].to_numpy(dtype=np.int64) + (
        ops["duration_us"].to_numpy(dtype=np.float64) * 1e3).astype(np.int64)
    extra = ({"compute_us": ("step_compute_us", "max")}
             if "step_compute_us" in ops.columns else {})
    return ops.assign(end_ns=end).groupby(["iteration", "rank"], sort=True).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
        comm_us=("duration_us", "sum"), n_ops=("duration_us", "size"), **extra,
    ).reset_index()


@pytest.fixture(scope="module")
def job() -> pd.DataFrame:
    fault = FaultSpec.parse("gpu_slow:rank=5,severity=0.5,start=4")
    return checked(without_labels(simulate(SimConfig(gpus=32, model="llama2-7b", iterations=8,
                                                     seed=2, faults=(fault,))).ops))


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_rank_spans_match_the_group_by_on_a_job_and_each_host(job):
    _same(_rank_spans(job), _rank_spans_groupby(job))
    for _, sub in per_host(job):
        _same(_rank_spans(sub), _rank_spans_groupby(sub))


def test_rank_spans_do_not_depend_on_row_order(job):
    shuffled = job.sample(frac=1.0, random_state=0)
    _same(_rank_spans(shuffled), _rank_spans_groupby(shuffled))
    # the sums of a pair's durations in another order may differ in the last bit only
    pd.testing.assert_frame_equal(_rank_spans(shuffled), _rank_spans(job), rtol=1e-12)


@pytest.mark.parametrize("rows", [0, 1, 7])
def test_rank_spans_of_few_rows(job, rows):
    head = job.iloc[:rows]
    _same(_rank_spans(head), _rank_spans_groupby(head))


def test_rank_spans_take_the_largest_compute_time_logged(job):
    ops = job.iloc[:400].copy()
    rng = np.random.default_rng(0)
    compute = rng.uniform(1e3, 1e5, len(ops))
    compute[rng.random(len(ops)) < 0.5] = np.nan  # missing on some rows of a step...
    ops["step_compute_us"] = compute
    ops.loc[(ops["iteration"] == ops["iteration"].min()) & (ops["rank"] == 0),
            "step_compute_us"] = np.nan  # ... and on every row of one
    got = _rank_spans(ops)
    _same(got, _rank_spans_groupby(ops))
    assert got["compute_us"].isna().any() and got["compute_us"].notna().any()


def _spans_groupby(iterations: pd.DataFrame) -> pd.DataFrame:
    return iterations.groupby("iteration").agg(start=("start_ns", "min"), end=("end_ns", "max"),
                                               last=("start_ns", "max"))


def test_iteration_spans_match_the_group_by(job):
    per = _rank_spans(job)
    _same(iteration_spans_of(per), _spans_groupby(per))
    shuffled = per.sample(frac=1.0, random_state=1)
    _same(iteration_spans_of(shuffled), _spans_groupby(shuffled))
    _same(iteration_spans_of(per.iloc[:1]), _spans_groupby(per.iloc[:1]))


def test_iteration_spans_of_other_dtypes_keep_pandas_rules(job):
    per = _rank_spans(job).astype({"end_ns": np.float64})
    per.loc[per.index[:3], "end_ns"] = np.nan  # a merged table with gaps
    _same(iteration_spans_of(per), _spans_groupby(per))
    nullable = _rank_spans(job).astype({"start_ns": "Int64"})
    _same(iteration_spans_of(nullable), _spans_groupby(nullable))


def _transfer_scores_groupby(ops: pd.DataFrame, cfg: LocalizeConfig, cls: np.ndarray
                             ) -> np.ndarray:
    o = ops.reset_index(drop=True)
    coll = ~o["op"].astype(str).isin(["send", "recv"]).to_numpy()
    out = np.zeros(len(o))
    if not coll.any():
        return out
    c = o[coll]
    cls = np.asarray(cls)[coll]
    inst = pd.factorize(c["group"].astype(str) + "/" + c["seq"].astype(str))[0]
    dur = pd.Series(c["duration_us"].to_numpy(dtype=np.float64))
    copies = dur.groupby(inst).transform("size").to_numpy()
    shortest = dur.groupby(inst).transform("min")
    first = ~pd.Series(inst).duplicated().to_numpy()
    per = pd.DataFrame({"cls": cls[first], "m": shortest.to_numpy()[first]})
    ref = per.groupby("cls")["m"].median()
    mad = (per["m"] - per["cls"].map(ref)).abs().groupby(per["cls"]).median()
    typical = pd.Series(cls).map(ref).to_numpy()
    sigma = 1.4826 * pd.Series(cls).map(mad).to_numpy()
    bar = np.maximum.reduce([np.full(len(c), cfg.min_wait_us), 3.0 * sigma,
                             cfg.rel_excess * typical])
    score = np.clip((shortest.to_numpy() - typical) / (2.0 * bar), 0.0, 1.0)
    out[coll] = np.where(copies >= 2, score, 0.0)
    return out


def test_transfer_scores_match_the_group_by(job):
    cfg = LocalizeConfig()
    for ops in [job, job.sample(frac=1.0, random_state=2), *(sub for _, sub in per_host(job))]:
        cls = _op_classes(ops)[1]
        want = _transfer_scores_groupby(ops, cfg, cls)
        np.testing.assert_array_equal(_transfer_scores(ops, cfg, cls), want)
        assert (want > 0).any()  # a comparison of zeros would prove nothing
    p2p = job[job["op"].isin(["send", "recv"])]
    np.testing.assert_array_equal(_transfer_scores(p2p, cfg), np.zeros(len(p2p)))



def _median_mad_frame(d: pd.Series, key: np.ndarray, regular) -> tuple[np.ndarray, np.ndarray]:
    """The regular references as a reindexed frame gave them (the window's own are unchanged)."""
    med, mad = _median_mad(d, key, None)
    mask, shift = regular
    kr = key[mask]
    dr = d[mask].reset_index(drop=True)
    by = dr.groupby(kr)
    ref = pd.DataFrame({"med": by.median(), "n": by.size(),
                        "mad": (dr - by.transform("median")).abs().groupby(kr).median()})
    ref = ref[ref["n"] >= 3].reindex(key)
    use = (med > shift * ref["med"]).to_numpy()
    return np.where(use, ref["med"], med), np.where(use, ref["mad"], mad)


def test_regular_class_references_match_the_reindexed_frame(job):
    d = pd.Series(job["duration_us"].to_numpy(dtype=np.float64))
    cls = _op_classes(job)[1]
    it = job["iteration"].to_numpy()
    slow = d * np.where(it >= 2, 1.5, 1.0)  # every class slower after iteration 2
    rng = np.random.default_rng(3)
    for durations, mask in [(slow, it < 2),  # the switch to regular iterations taken
                            (d, rng.random(len(job)) < 0.02),  # most keys with < 3 regular
                            (d, np.zeros(len(job), dtype=bool))]:
        got = _median_mad(durations, cls, (mask, 1.05))
        want = _median_mad_frame(durations, cls, (mask, 1.05))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    switched = _median_mad(slow, cls, (it < 2, 1.05))[0]
    assert (switched != _median_mad(slow, cls, None)[0]).any()  # else the test proves nothing


def test_group_sizes_count_the_ranks_seen_when_no_member_list(job):
    p2p = job["op"].isin(["send", "recv"]).to_numpy()
    seen = job.groupby("group", observed=True)["rank"].transform("nunique").to_numpy()
    want = np.where(p2p, 2.0, seen.astype(np.float64))
    got = _group_sizes(job.drop(columns="group_ranks"))
    np.testing.assert_array_equal(got, want)
    host = per_host(job)[0][1].drop(columns="group_ranks")  # fewer ranks seen than members
    seen = host.groupby("group", observed=True)["rank"].transform("nunique").to_numpy()
    np.testing.assert_array_equal(_group_sizes(host), np.where(
        host["op"].isin(["send", "recv"]).to_numpy(), 2.0, seen.astype(np.float64)))
    assert (_group_sizes(host) < _group_sizes(host.assign(group_ranks=job["group_ranks"]))).any()


@pytest.mark.parametrize("dtype", ["category", "str", "object"])
def test_is_p2p_as_isin(job, dtype):
    op = job["op"].astype(dtype)
    np.testing.assert_array_equal(_is_p2p(op), op.isin(["send", "recv"]).to_numpy())
    assert _is_p2p(op).any() and not _is_p2p(op).all()


def test_op_positions_match_the_group_by(job):
    for ops in (job, job.sample(frac=1.0, random_state=4), job.iloc[:0]):
        seq = ops["seq"].to_numpy(dtype=np.int64)
        first = ops.groupby(["iteration", "group", "rank"], observed=True)["seq"].transform("min")
        np.testing.assert_array_equal(_op_classes(ops)[0], seq - first.to_numpy(dtype=np.int64))
    assert (_op_classes(job)[0] > 0).any()


@pytest.mark.parametrize("delta", [1.02, 1.1, 1.3])
def test_irregular_iterations_are_the_monitor_tables(job, delta):
    per = _rank_spans(job)
    table, _ = iteration_monitor(per, delta)
    want = tuple(int(i) for i in table.index[table["irregular"].to_numpy()])
    assert _irregular(per, delta, log=False) == want
    if delta < 1.3:
        assert want  # the job's straggler makes some iterations irregular


def test_feature_iteration_context_is_the_monitor_tables(job):
    from holmes_ml.features import FeatureConfig, IrregularityConfig, detect_irregular
    from holmes_ml.features.build import _iteration_context
    from holmes_ml.features.iterations import iteration_spans, iteration_times, last_arrivals

    it = job["iteration"].to_numpy(dtype=np.int64)
    rank = job["rank"].to_numpy(dtype=np.int64)
    start = job["start_ns"].to_numpy(dtype=np.int64)
    dur = job["duration_us"].to_numpy(dtype=np.float64)
    for cfg in (FeatureConfig(), FeatureConfig(irregularity=IrregularityConfig(delta=1.02))):
        ratio, regular, it_start = _iteration_context(it, rank, start, dur, cfg)
        uniq, first, end, _ = iteration_spans(it, start, dur)
        time_ns, _ = iteration_times(uniq, first, end,
                                     last_arrival_ns=last_arrivals(it, rank, start)[1])
        det = detect_irregular(pd.DataFrame({"duration_s": time_ns / 1e9},
                                            index=pd.Index(uniq, name="iteration")),
                               cfg.irregularity)
        where = np.searchsorted(uniq, it)
        np.testing.assert_array_equal(ratio, det["ratio"].to_numpy()[where])
        np.testing.assert_array_equal(regular, ~det["irregular"].to_numpy()[where])
        np.testing.assert_array_equal(it_start, first[where])
        assert not regular.all()


def _gappy(job: pd.DataFrame, empty_list: bool) -> pd.DataFrame:
    """Member lists and kinds missing from some groups' first rows (and from every row of
    one group), and, with ``empty_list``, one group's list empty on every row (its members
    then come from the ranks seen)."""
    ops = job.reset_index(drop=True)
    groups = ops["group"].astype(str)
    names = sorted(groups.unique())
    ranks = ops["group_ranks"].astype(object)
    kinds = ops["group_kind"].astype(object)
    for name in names[:5]:
        rows = np.flatnonzero((groups == name).to_numpy())
        ranks.iloc[rows[:3]] = None
        kinds.iloc[rows[:2]] = None
    ranks[(groups == names[5]).to_numpy()] = None
    if empty_list:
        ranks[(groups == names[-1]).to_numpy()] = ""
    return ops.assign(group_ranks=ranks.astype("category"), group_kind=kinds.astype("category"))


def test_groups_of_match_the_group_by_of_every_row(job):
    cases = [job, job.iloc[::-1], job.iloc[:0], job.drop(columns="group_ranks"),
             job.drop(columns="group_kind"), job.astype({"group": object}),
             _gappy(job, False), _gappy(job, True),
             *(sub for _, sub in per_host(job)),
             *(sub for _, sub in per_host(_gappy(job, True)))]
    for ops in cases:
        _same(_groups_of(ops), _groups_by_text(ops))  # the group-by of the names
    gappy = _groups_of(_gappy(job, True))
    assert gappy["group_ranks"].isna().any()  # the group with no list on any row
    name = gappy["group"].iloc[-1]
    assert gappy["group_ranks"].iloc[-1] == " ".join(
        str(r) for r in sorted(job.loc[job["group"].astype(str) == name, "rank"].unique()))


def test_medians_by_key_match_the_group_by(job):
    per = _rank_spans(job)
    for frame in (per, per.sample(frac=1.0, random_state=5), per.iloc[:1], per.iloc[:0],
                  per[per["rank"] % 3 != 0]):  # an odd and an even count of ranks
        for col in ("start_ns", "end_ns"):
            t = frame[col].astype(np.float64)
            want = t.groupby(frame["iteration"]).transform("median").to_numpy()
            got = _medians_by(frame["iteration"].to_numpy(dtype=np.int64), t.to_numpy())
            np.testing.assert_array_equal(got, want)


def test_far_clocks_are_still_told(job, caplog):
    per = _rank_spans(job)
    _warn_far_clocks(per)
    assert "lie" not in caplog.text
    per.loc[per.index[5], "start_ns"] += 3 * 86_400 * 10**9
    _warn_far_clocks(per)
    assert f"rank {int(per['rank'].iloc[5])}'s operators lie 3.0 days after" in caplog.text
