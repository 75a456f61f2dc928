"""Would features read off the whole chain of waits behind an operator close the 256-4,096 GPU
gap of ``holmes bench detector``?

The misses there are pipeline receives and tensor-parallel all-reduces that waited on a rank
made late, several hops before, by a persistent slow NIC, link or switch. The detector's
``late_prev_*`` columns look one hop back: the op the instance's last arrival ran just before
it. This script follows that step again and again within the iteration (the op waits for its
instance's last arrival; that rank ran some op before; that op waited for its own instance's
last arrival; ...), up to each of ``--depths`` hops, and gives each operator the largest value
met on the way of a few of the detector's own columns (a slow transfer, a copy far outside its
stage, a transfer slower than its own history; ``--first-pass``: also an out-of-fold first
pass's score), and the same chain columns over their median on the same op step of the
operator's pipeline stage (``stage-relative``: a chain as long as its stage's others is 1
however noisy the cluster). Beside the chains, one more kind of context: each copy against its
op step on its stage at the step's best iteration so far (``stage_baseline``), which a
persistent fault cannot fill as it fills the copy's history. It trains the shipped detector's
trees (``scale_free_estimator``) on the default training mix with and without those columns,
once per ``--seeds`` random state, and prints the bench's per-scale F1 on the bench's held-out
rows and each variant's per-run table.

Since ``6aea201`` the detector has the 16-hop chains of those four columns itself
(``chain_*``); the script's baseline, "detector's columns", leaves them out, so that each
variant adds its own chain to the columns the detector had before.

Usage: ``.venv/bin/python scripts/chain_context.py`` (13 minutes on 2 cores; ``--depths 8 16
32 --seeds 0 1 2``; ``--depths 16 --first-pass``; ``--depths 16 --plain``: the baseline and
the plain chains only, the comparison behind the shipped columns; ``--quick``: the tiny preset
and two small held-out jobs, a smoke test).
"""
import argparse
import time

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from holmes_ml.bench.detector import _per_run_rows, _scores_row, heldout_scenarios
from holmes_ml.features import FEATURE_COLUMNS, build_features
from holmes_ml.features import _segments as seg
from holmes_ml.features.build import _chain_max
from holmes_ml.models.training import scale_free_estimator, scenarios
from holmes_ml.simulator import simulate

#: detector columns whose largest value along the chain is taken
CHAINED = ("step_xfer_ratio", "stage_step_z", "stage_step_ratio", "xfer_hist_ratio")
MORE = ("step_peer_ratio", "hist_ratio")


def wait_chain(ops: pd.DataFrame) -> np.ndarray:
    """Per row, the row it waits on one hop back: the op its instance's last arrival ran just
    before it in the same iteration (-1: none). Instances as ``build_features`` forms them."""
    o = ops.reset_index(drop=True)
    n = len(o)
    it = o["iteration"].to_numpy(np.int64)
    rank = o["rank"].to_numpy(np.int64)
    seq = o["seq"].to_numpy(np.int64)
    start = o["start_ns"].to_numpy(np.int64)
    op = o["op"].astype(str).to_numpy()
    peer = o["peer"].to_numpy(np.int64) if "peer" in o else np.full(n, -1)
    gcode = pd.factorize(o["group"])[0].astype(np.int64)
    is_send = op == "send"
    known = np.isin(op, ["send", "recv"]) & (peer >= 0)
    src = np.where(known, np.where(is_send, rank, peer) + 1, 0)
    dst = np.where(known, np.where(is_send, peer, rank) + 1, 0)
    it0 = it - it.min()
    sid = seg.dense(seg.combine(it0, gcode, seq - seq.min(), src, dst))
    order = np.lexsort((start, sid))
    ends = np.r_[np.flatnonzero(np.diff(sid[order])), n - 1]
    last_of = np.empty(int(sid.max()) + 1, dtype=np.int64)
    last_of[sid[order[ends]]] = order[ends]
    last = last_of[sid]
    order = np.lexsort((start, rank, it0))
    prev = np.full(n, -1, dtype=np.int64)
    same = (it0[order[1:]] == it0[order[:-1]]) & (rank[order[1:]] == rank[order[:-1]])
    prev[order[1:]] = np.where(same, order[:-1], -1)
    return prev[last]


def chain_max(hop: np.ndarray, values: dict[str, np.ndarray], depths) -> pd.DataFrame:
    """Largest value of each of ``values`` over the first 1 .. d hops of the chain, for each d
    of ``depths`` (``build_features``' own chain columns are d = 16 of four of them)."""
    out = {}
    for d in depths:
        for k, best in zip(values, _chain_max(hop, list(values.values()), d), strict=True):
            out[f"chain{d}_{k}"] = best
    return pd.DataFrame(out).astype(np.float32)


def _place(ops: pd.DataFrame) -> np.ndarray:
    """Each row's place among its rank's ops of the iteration, in start order (from 1)."""
    return ops.groupby(["iteration", "rank"], sort=False)["start_ns"].rank(
        method="first").to_numpy()


def stage_relative(ops: pd.DataFrame, F: pd.DataFrame, C: pd.DataFrame, place: np.ndarray
                   ) -> pd.DataFrame:
    """Each chain column over its median on the same op step at the same place of the rank's
    iteration (``build_features``' stage-step key before it took the stage from the
    communicators too; ``place`` from :func:`_place`): a chain as long as its stage's others is 1
    however noisy the cluster."""
    o = ops.reset_index(drop=True)
    key = pd.DataFrame({"it": o["iteration"].to_numpy(), "kind": F["group_kind_code"].to_numpy(),
                        "op": F["op_code"].to_numpy(), "seq": o["seq"].to_numpy(),
                        "bytes": F["log2_bytes"].to_numpy(), "place": place})
    sid = key.groupby(list(key.columns), sort=False).ngroup().to_numpy()
    med = C.groupby(sid).transform("median")
    out = C / med.where(med > 0, 1.0)
    out.columns = [f"{c}_rel" for c in C.columns]
    return out.astype(np.float32)


BASELINE = ("base_stage_ratio", "base_stage_z", "base_med_ratio")


def stage_baseline(ops: pd.DataFrame, F: pd.DataFrame, place: np.ndarray) -> pd.DataFrame:
    """Each copy against its op step on its stage (communicator kind, op, size and place in the
    rank's iteration; no sequence number, so the same step across iterations) at the step's best
    iteration so far, the one with the lowest median: a persistent fault prolongs a step's
    copies on every rank of the stage alike, which the stage's own median then absorbs, and
    the copies' history absorbs it after a window; the best iteration remembers the step
    without it. ``base_stage_ratio``: duration over that median; ``base_stage_z``: robust
    z-score against it (1.4826 x that iteration's median absolute deviation, floored at 5 %
    of the median); ``base_med_ratio``: this iteration's median over it."""
    o = ops.reset_index(drop=True)
    d = pd.DataFrame({"it": o["iteration"].to_numpy(), "kind": F["group_kind_code"].to_numpy(),
                      "op": F["op_code"].to_numpy(), "b": F["log2_bytes"].to_numpy(),
                      "place": place, "dur": o["duration_us"].to_numpy(float)})
    d["step"] = d.groupby(["kind", "op", "b", "place"], sort=False).ngroup()
    by = [d["step"], d["it"]]
    med_row = d.groupby(by)["dur"].transform("median")
    st = pd.DataFrame({"med": d.groupby(by)["dur"].median(),
                       "mad": (d["dur"] - med_row).abs().groupby(by).median()})
    st = st.reset_index().sort_values(["step", "it"])
    st["best_med"] = st.groupby("step")["med"].cummin()
    st["best_mad"] = st["mad"].where(st["med"] == st["best_med"]).groupby(st["step"]).ffill()
    st = st.set_index(["step", "it"]).reindex(pd.MultiIndex.from_arrays(by))
    best, dur = st["best_med"].to_numpy(), d["dur"].to_numpy()
    sd = np.maximum(np.maximum(1.4826 * st["best_mad"].to_numpy(), 0.05 * best), 1.0)
    return pd.DataFrame({"base_stage_ratio": dur / np.maximum(best, 1.0),
                         "base_stage_z": (dur - best) / sd,
                         "base_med_ratio": st["med"].to_numpy() / np.maximum(best, 1.0)}
                        ).astype(np.float32)


def rows(cfgs, first_pass, depths, max_normal, seed):
    """Simulate cfgs, add the chain columns (``first_pass(i, F)``: run i's first-pass scores,
    or None), and subsample the other ops like ``make_dataset``."""
    rng = np.random.default_rng(seed)
    Xs, ys, ids, ws = [], [], [], []
    for i, cfg in enumerate(cfgs):
        t = time.time()
        res = simulate(cfg)
        F = build_features(res.ops).reset_index(drop=True)
        values = {k: F[k].to_numpy(np.float64) for k in CHAINED + MORE}
        s1 = first_pass(i, F)
        if s1 is not None:
            values["s1"] = s1
        C = chain_max(wait_chain(res.ops), values, depths)
        place = _place(res.ops.reset_index(drop=True))
        C = pd.concat([C, stage_relative(res.ops, F, C, place),
                       stage_baseline(res.ops, F, place)], axis=1)
        y = res.ops["abnormal"].to_numpy(dtype=bool)
        sure = y | res.ops["affected"].to_numpy(dtype=bool)
        keep = np.ones(len(y), dtype=bool)
        if max_normal is not None and (~sure).sum() > max_normal:
            other = np.flatnonzero(~sure)
            keep[rng.choice(other, size=len(other) - max_normal, replace=False)] = False
        Xs.append(pd.concat([F, C], axis=1)[keep].reset_index(drop=True))
        ys.append(y[keep])
        ids.append(np.full(int(keep.sum()), i))
        ow = (~sure).sum() / max(int((~sure & keep).sum()), 1)
        ws.append(np.where(sure[keep], 1.0, ow))
        print(f"  run {i}: {len(y)} ops, {int(y.sum())} abnormal, {time.time() - t:.0f}s",
              flush=True)
    return pd.concat(Xs, ignore_index=True), np.concatenate(ys), np.concatenate(ids), \
        np.concatenate(ws)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test in a minute or two")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 4, 16, 64, 256],
                        help="chain depths to try (powers of two)")
    parser.add_argument("--first-pass", action="store_true",
                        help="also chain an out-of-fold first pass's scores (simulates the "
                        "training runs twice)")
    parser.add_argument("--plain", action="store_true",
                        help="only the baseline and the plain chains (no stage-relative, "
                        "stage-baseline or longer-column variants)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="random states of the trees (each variant trained once per seed)")
    args = parser.parse_args()
    depths = sorted(set(args.depths))
    if any(d & (d - 1) for d in depths):
        parser.error("--depths: powers of two only")
    train_cfgs = scenarios("tiny" if args.quick else "default", 0)
    print("training rows", flush=True)
    X, y, run, w = rows(train_cfgs, lambda i, F: None, depths, 20_000, 0)
    # the detector's columns before it had its own chains (the same values as chain16_*)
    cols = [c for c in FEATURE_COLUMNS if not c.startswith("chain_")]
    if args.first_pass:
        full = scale_free_estimator(0).fit(X[cols], y, groups=run, threshold_weights=w)
        # out-of-fold: each training run scored by trees that never saw it
        fold_of = np.zeros(len(train_cfgs), dtype=int)
        folds = {}
        for f, (tr, te) in enumerate(GroupKFold(n_splits=3).split(X, y, groups=run)):
            folds[f] = scale_free_estimator(0).fit(X.loc[tr, cols], y[tr], groups=run[tr],
                                                   threshold_weights=w[tr])
            fold_of[np.unique(run[te])] = f
        print("training rows again, with the first pass's scores", flush=True)
        X, y, run, w = rows(train_cfgs, lambda i, F: np.asarray(
            folds[fold_of[i]].decision_function(F[cols]), dtype=np.float64), depths, 20_000, 0)

    def held_first(i, F):
        if not args.first_pass:
            return None
        return np.asarray(full.decision_function(F[cols]), dtype=np.float64)

    hcfgs = heldout_scenarios(args.quick)[:2] if args.quick else heldout_scenarios()
    print("held-out rows", flush=True)
    Xh, yh, runh, wh = rows(hcfgs, held_first, depths, 100_000, 1)
    scales = sorted({c.gpus for c in hcfgs})
    scale_of = np.array([hcfgs[r].gpus for r in runh])
    deep = depths[-1]
    variants = {"detector's columns": []}
    variants.update({f"+ chain {d} hops": [f"chain{d}_{k}" for k in CHAINED] for d in depths})
    if not args.plain:
        variants[f"+ chain {deep} hops, more columns"] = [f"chain{deep}_{k}"
                                                          for k in CHAINED + MORE]
        variants.update({f"+ chain {d} hops, stage-relative": [f"chain{d}_{k}_rel"
                                                               for k in CHAINED]
                         for d in depths})
        variants[f"+ chain {deep} hops, transfer ratio and its stage-relative"] = [
            f"chain{deep}_step_xfer_ratio", f"chain{deep}_step_xfer_ratio_rel"]
        variants["+ the stage's best iteration (no chain)"] = list(BASELINE)
        variants["+ base_stage_z alone (no chain)"] = ["base_stage_z"]
    if args.first_pass:
        variants[f"+ chain {deep} hops, first pass"] = [f"chain{deep}_{k}"
                                                        for k in (*CHAINED, "s1")]
    for seed in args.seeds:
        for name, extra in variants.items():
            m = scale_free_estimator(seed).fit(X[cols + extra], y, groups=run,
                                               threshold_weights=w)
            pred = np.asarray(m.predict(Xh[cols + extra])).astype(bool)
            print(_scores_row(f"{name} (seed {seed})", yh, pred, scale_of, scales, wh),
                  flush=True)
            for r in _per_run_rows(yh, pred, runh, hcfgs, wh):
                print("   ", r)


if __name__ == "__main__":
    main()
