"""Would a second detector that sees the first one's verdicts on neighbouring operators close
the 256-4,096 GPU gap of ``holmes bench detector``?

The misses there are waits passed down from a persistent slow NIC, link or switch (pipeline
receives, tensor-parallel all-reduces) that look like jitter's waits one op at a time. This
script trains the shipped detector's trees (first pass, out-of-fold on the training runs: three
folds by run) and then the same trees again on the features plus context read off the first
pass's scores: the share of flagged ops of the rank in that iteration and their mean score, of
the communicator in that iteration, of the whole iteration, the highest score of the rank's two
ops before and after, the highest score among the copies of the same collective instance, the
rank's flagged share over its earlier iterations, and the op's own first-pass score. It prints
the bench's per-scale F1 on the bench's held-out rows for the first pass and three context sets,
and each set's per-run table. ``--whole-log`` tries instead the rank's flagged share over the
whole log read (its other operators, every iteration: a fault's abnormal copies sit on few
signatures, each abnormal in a few of its iterations, and jitter's far-out copies on others;
``scripts/level_shift.py --delays``), alone and beside the op's own score. ``--cleaned-crowd``
tries instead the copy against its op step's crowd on its pipeline stage (the key of
``stage_step_z``) with the copies the first pass flags left out: the copy's robust z-score and
ratio against the median of the rest, and the share of its crowd flagged. A rule that knows which
copies the fault touched gets closer to the label with that crowd than with the whole one
(``scripts/stage_ceiling.py --spreads``); this asks whether the detector does.

Usage: ``.venv/bin/python scripts/context_stack.py`` (about 15 minutes on 2 cores;
``--whole-log``: 7 minutes; ``--cleaned-crowd``: 30 minutes; ``--quick``: the tiny preset and
two small held-out jobs, a smoke test).
"""
import argparse
import time

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold
from stage_ceiling import STAGE_STEP, robust_z, step_frame

from holmes_ml.bench.detector import _per_run_rows, _scores_row, heldout_scenarios
from holmes_ml.features import FEATURE_COLUMNS, build_features
from holmes_ml.models.training import make_dataset, scale_free_estimator, scenarios
from holmes_ml.simulator import simulate

CTX = ["c_rank_iter", "c_rank_iter_mean", "c_group_iter", "c_iter", "c_prev", "c_next",
       "c_inst_max", "c_rank_hist", "s1"]


def context(ops: pd.DataFrame, s1: np.ndarray, thr: float) -> pd.DataFrame:
    o = ops.reset_index(drop=True)
    flag = (s1 >= thr).astype(np.float32)
    d = pd.DataFrame({"it": o["iteration"].to_numpy(), "rank": o["rank"].to_numpy(),
                      "group": o["group"].astype(str).to_numpy(), "seq": o["seq"].to_numpy(),
                      "start": o["start_ns"].to_numpy(), "f": flag, "s": s1})
    out = pd.DataFrame(index=d.index)
    g = d.groupby(["it", "rank"])
    out["c_rank_iter"] = g["f"].transform("mean")
    out["c_rank_iter_mean"] = g["s"].transform("mean")
    out["c_group_iter"] = d.groupby(["it", "group"])["f"].transform("mean")
    out["c_iter"] = d.groupby("it")["f"].transform("mean")
    out["c_inst_max"] = d.groupby(["it", "group", "seq"])["s"].transform("max")
    order = np.lexsort((d["start"].to_numpy(), d["rank"].to_numpy()))
    ss = d["s"].to_numpy()[order]
    rk = d["rank"].to_numpy()[order]
    prev = np.zeros(len(ss))
    nxt = np.zeros(len(ss))
    for k in (1, 2):
        p = np.r_[np.zeros(k), ss[:-k]]
        same = np.r_[np.zeros(k, bool), rk[k:] == rk[:-k]]
        prev = np.maximum(prev, np.where(same, p, 0))
        n = np.r_[ss[k:], np.zeros(k)]
        same = np.r_[rk[:-k] == rk[k:], np.zeros(k, bool)]
        nxt = np.maximum(nxt, np.where(same, n, 0))
    out["c_prev"] = 0.0
    out["c_next"] = 0.0
    out.iloc[order, out.columns.get_loc("c_prev")] = prev
    out.iloc[order, out.columns.get_loc("c_next")] = nxt
    # the rank's flag share over its earlier iterations
    ri = d.groupby(["rank", "it"])["f"].mean().reset_index().sort_values(["rank", "it"])
    cs = ri.groupby("rank")["f"].cumsum() - ri["f"]
    cnt = ri.groupby("rank").cumcount()
    ri["hist"] = np.where(cnt > 0, cs / np.maximum(cnt, 1), 0.0)
    out["c_rank_hist"] = d[["rank", "it"]].merge(ri[["rank", "it", "hist"]], on=["rank", "it"],
                                                  how="left")["hist"].to_numpy()
    rank = d.groupby("rank")["f"]
    out["c_rank_log"] = ((rank.transform("sum") - d["f"])
                         / np.maximum(rank.transform("size") - 1, 1)).to_numpy()
    out["s1"] = s1
    return out.astype(np.float32)


#: columns of --cleaned-crowd
CROWD = ["cc_z", "cc_ratio", "cc_share"]


def cleaned_crowd(ops: pd.DataFrame, s1: np.ndarray, thr: float) -> pd.DataFrame:
    """Each copy against its stage step's copies the first pass does not flag (``CROWD``): its
    robust z-score (1.4826 x MAD, floored at 1 % of the median, as ``stage_step_z``) and its
    ratio to their median (the whole crowd's where the first pass flags every copy), and the
    crowd's flagged share. The crowd is ``stage_step_z``'s (``stage_ceiling.STAGE_STEP``)."""
    d = step_frame(ops.reset_index(drop=True))
    flag = pd.Series(s1 >= thr)
    med, sd = robust_z(d, STAGE_STEP, "dur", ~flag)
    whole_med, whole_sd = robust_z(d, STAGE_STEP, "dur")  # where every copy is flagged
    med, sd = med.fillna(whole_med).to_numpy(), sd.fillna(whole_sd).to_numpy()
    share = flag.astype(np.float64).groupby([d[k] for k in STAGE_STEP]).transform("mean")
    dur = d["dur"].to_numpy(dtype=np.float64)
    return pd.DataFrame({"cc_z": np.clip((dur - med) / np.maximum(sd, 1e-3), -50, 50),
                         "cc_ratio": np.clip(dur / np.maximum(med, 1e-3), -50, 50),
                         "cc_share": share.to_numpy()}).astype(np.float32)


def rows(cfgs, first_models, run_model, max_normal, seed, thr_of, ctx=context):
    """Re-simulate cfgs, first-pass score every op, add context, subsample like make_dataset."""
    rng = np.random.default_rng(seed)
    Xs, ys, ids, ws = [], [], [], []
    for i, cfg in enumerate(cfgs):
        t = time.time()
        res = simulate(cfg)
        F = build_features(res.ops)
        m = first_models[run_model(i)]
        s1 = np.asarray(m.decision_function(F.loc[:, list(FEATURE_COLUMNS)]), dtype=np.float64)
        C = ctx(res.ops, s1, thr_of(m))
        y = res.ops["abnormal"].to_numpy(dtype=bool)
        sure = y | res.ops["affected"].to_numpy(dtype=bool)
        keep = np.ones(len(y), dtype=bool)
        if max_normal is not None and (~sure).sum() > max_normal:
            other = np.flatnonzero(~sure)
            drop = rng.choice(other, size=len(other) - max_normal, replace=False)
            keep[drop] = False
        X = pd.concat([F.reset_index(drop=True), C], axis=1)[keep].reset_index(drop=True)
        Xs.append(X)
        ys.append(y[keep])
        ids.append(np.full(int(keep.sum()), i))
        ow = (~sure).sum() / max(int((~sure & keep).sum()), 1)
        ws.append(np.where(sure[keep], 1.0, ow))
        print(f"  run {i}: {len(y)} ops {time.time() - t:.0f}s", flush=True)
    return pd.concat(Xs, ignore_index=True), np.concatenate(ys), np.concatenate(ids), \
        np.concatenate(ws)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test in a minute or two")
    parser.add_argument("--whole-log", action="store_true",
                        help="the rank's flagged share over the whole log instead")
    parser.add_argument("--cleaned-crowd", action="store_true",
                        help="the copy against its stage step's copies the first pass does not "
                             "flag instead")
    args = parser.parse_args()
    quick = args.quick
    train_cfgs = scenarios("tiny" if quick else "default", 0)
    X, y, run, w = make_dataset(train_cfgs, seed=0, return_weights=True)
    print("first pass data", X.shape, flush=True)
    folds = {}
    gkf = GroupKFold(n_splits=3)
    fold_of = np.zeros(len(train_cfgs), dtype=int)
    for f, (tr, te) in enumerate(gkf.split(X, y, groups=run)):
        m = scale_free_estimator(0).fit(X.iloc[tr], y[tr], groups=run[tr],
                                        threshold_weights=w[tr])
        folds[f] = m
        for r in np.unique(run[te]):
            fold_of[r] = f
    full = scale_free_estimator(0).fit(X, y, groups=run, threshold_weights=w)
    folds["full"] = full
    del X
    thr = lambda m: float(m.threshold_)  # noqa: E731
    print("second pass (train)", flush=True)
    ctx = cleaned_crowd if args.cleaned_crowd else context
    X2, y2, run2, w2 = rows(train_cfgs, folds, lambda i: fold_of[i], 20_000, 0, thr, ctx)
    hcfgs = heldout_scenarios(quick)[:2] if quick else heldout_scenarios()
    print("held-out", flush=True)
    Xh, yh, runh, wh = rows(hcfgs, folds, lambda i: "full", 100_000, 1, thr, ctx)
    scales = sorted({c.gpus for c in hcfgs})
    scale_of = np.array([hcfgs[r].gpus for r in runh])
    base = np.asarray(full.predict(Xh.loc[:, list(FEATURE_COLUMNS)])).astype(bool)
    print(_scores_row("first pass", yh, base, scale_of, scales, wh))
    sets = {"ctx all": CTX, "ctx no s1": CTX[:-1],
            "ctx local": ["c_rank_iter", "c_prev", "c_next", "c_inst_max", "s1"]}
    if args.whole_log:
        sets = {"rank's share over the log": ["c_rank_log"],
                "rank's share over the log, with s1": ["c_rank_log", "s1"]}
    if args.cleaned_crowd:
        sets = {"crowd cleaned": CROWD, "crowd cleaned, no share": CROWD[:2]}
    for name, cols in sets.items():
        X2c = pd.concat([X2.loc[:, list(FEATURE_COLUMNS)], X2[cols]], axis=1)
        Xhc = pd.concat([Xh.loc[:, list(FEATURE_COLUMNS)], Xh[cols]], axis=1)
        m2 = scale_free_estimator(0).fit(X2c, y2, groups=run2, threshold_weights=w2)
        pred = np.asarray(m2.predict(Xhc)).astype(bool)
        print(_scores_row(name, yh, pred, scale_of, scales, wh), flush=True)
        for r in _per_run_rows(yh, pred, runh, hcfgs, wh):
            print("   ", r)
    for r in _per_run_rows(yh, base, runh, hcfgs, wh):
        print(" base", r)


if __name__ == "__main__":
    main()
