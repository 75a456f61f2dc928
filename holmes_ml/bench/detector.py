"""``holmes bench detector``: op-level F1 by scale for every detector, on held-out scenarios.

Detectors train on one seeded scenario mix and are scored on scenarios with other seeds, other
scales and other fault placements, all in one run so the comparison is like for like.
Scores are against the simulator's ``abnormal`` label (prolonged beyond what the fault-free
copies of the same step show); the same predictions are also scored against ``affected``
(prolonged by the fault at all, visible or not), in a second table.

Every abnormal or affected held-out op is scored, beside a sample of the other ops of each run
weighted back to their run (:func:`~holmes_ml.models.training.make_dataset`): F1 per scale then
rests on all of that scale's positives (a uniform sample of a million ops from runs of up to
8,192 GPUs kept a dozen of the 256-GPU ones). ``all`` pools every held-out op, so it follows
the biggest runs; ``mean`` is the plain mean over the scales. A third table breaks the
shipped method's result down by held-out run (scale, model, fault), with precision and recall.

Those ten jobs rotate the fault kinds over the scales, so each scale meets two kinds: the
per-scale figures then compare kinds as much as scales. The shipped method is therefore also
scored on a grid of every fault kind, persistent and as a one-iteration spike, at every scale
(:func:`kind_grid_scenarios`, one job per cell on seeds of its own), in a fourth table (F1 per
kind and pattern at each scale, pooled over the cell's rows) whose last row, every kind and
pattern of a scale pooled, gives the ``f1_lgbm_grid_gpus_*`` figures.

A full run takes one to two and a half hours on 2 cores, most of it the random forest's fits;
``holmes bench detector --method NAME`` (repeatable) scores only those methods beside the
shipped one, whose tables are the same as a full run's.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from sklearn.metrics import f1_score, precision_score, recall_score

from holmes_ml.bench.record import BenchResult

logger = logging.getLogger(__name__)


#: The methods of the bench, in the order they run and are tabled: the shipped one first,
#: then the other supervised detectors, then the baselines.
SUPERVISED = ("lgbm", "lgbm-absolute", "lgbm-small", "rf", "tuned-lgbm")
BASELINES = ("3sigma", "knn", "svm", "iforest")
METHODS = SUPERVISED + BASELINES


def choose_methods(names=()) -> tuple[str, ...]:
    """The methods a run scores, in bench order: ``names`` (every method when empty) and the
    shipped one, ``lgbm``, always (the per-run table and the kind grid are of it).

    Raises
    ------
    ValueError
        A name that is not one of :data:`METHODS`.
    """
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"--method {unknown[0]!r}: not a method of bench detector; expected "
                         f"one or more of {', '.join(METHODS)} (repeat the option)")
    if not names:
        return METHODS
    return tuple(m for m in METHODS if m == "lgbm" or m in names)


def _methods(quick: bool) -> dict:
    from holmes_ml.models import (
        IsolationForestDetector,
        KNNDetector,
        RandomForestDetector,
        SVMDetector,
        ThreeSigmaDetector,
        TunedDetector,
    )
    from holmes_ml.models.training import (
        SCALE_DEPENDENT,
        absolute_estimator,
        default_estimator,
        small_estimator,
    )

    return {
        "lgbm": default_estimator(0),  # the shipped default model's configuration (screened)
        "lgbm-absolute": absolute_estimator(0),  # all columns, balanced (shipped before)
        "lgbm-small": small_estimator(0),  # scale-free, 30 depth-3 trees (throughput)
        "rf": RandomForestDetector(n_estimators=40 if quick else 100, max_depth=16,
                                   min_samples_leaf=3, threshold="auto", random_state=0,
                                   ignore_features=SCALE_DEPENDENT, class_weight=None,
                                   n_jobs=2),
        "tuned-lgbm": TunedDetector("lgbm", n_trials=3 if quick else 20,
                                    max_tune_samples=30_000, random_state=0),
        "3sigma": ThreeSigmaDetector(feature="hist_z"),
        "knn": KNNDetector(threshold="auto"),
        "svm": SVMDetector(threshold="auto", random_state=0),
        "iforest": IsolationForestDetector(random_state=0, contamination=0.03),
    }


#: The scales the bench scores, full run / ``quick`` (the kind grid's seeds follow a scale's
#: place among them)
SCALES: tuple[tuple[int, ...], tuple[int, ...]] = ((64, 256, 1024, 4096, 8192),
                                                   (64, 128, 256, 512, 1024))


def _heldout(scales, seed: int, iterations: int):
    from holmes_ml.simulator import FaultSpec, SimConfig

    kinds = ("gpu_slow", "nic_slow", "link_slow", "switch_congested", "host_stall")
    cfgs = []
    for i, gpus in enumerate(scales):
        rotated = kinds[i % 5:] + kinds[:i % 5]
        for j, kind in enumerate(rotated[:2]):
            cfgs.append(SimConfig(gpus=gpus, iterations=iterations, seed=seed + 10 * i + j,
                                  model="llama2-7b" if j else "llama2-70b" if gpus >= 256
                                  else "llama2-13b",
                                  faults=(FaultSpec(kind=kind, severity=0.5,
                                                    pattern=("persistent", "spike")[j],
                                                    start_iteration=5),)))
    return cfgs


def heldout_scenarios(quick: bool = False) -> list:
    """The held-out jobs the bench scores (two per scale, see :func:`_heldout`), for tools
    that look into one of them (``scripts/miss_profile.py``)."""
    scales = SCALES[quick]
    return _heldout(scales, seed=500, iterations=16 if quick else 24)


#: Every fault kind the simulator injects, in the grid's order (:func:`kind_grid_scenarios`)
GRID_KINDS: tuple[str, ...] = ("gpu_slow", "host_stall", "nic_slow", "link_slow",
                               "switch_congested")
#: The grid's simulator seeds start here: clear of the training presets' (``seed * 1000`` plus
#: the run's place, under 240 for the bundled model's seed 0) and of the ten held-out jobs' (500+)
GRID_FIRST_SEED = 7000


def kind_grid_scenarios(scales, patterns=("persistent", "spike"), repeats: int = 1,
                        iterations: int = 24) -> list:
    """``repeats`` jobs of every fault kind (:data:`GRID_KINDS`) in every pattern at every scale,
    each on its own seed and drawn like the ten held-out jobs' persistent ones: LLaMA2-70B from
    256 GPUs up, LLaMA2-13B below, severity 0.5 from iteration 5. Ordered by scale, then
    pattern, then kind, then repeat. A job's seed follows its scale's and pattern's places in
    ``scales`` and ``patterns``: the bench's own cells are those of its whole scale list."""
    from holmes_ml.simulator import FaultSpec, SimConfig

    out = []
    for i, gpus in enumerate(scales):
        for p, pattern in enumerate(patterns):
            for k, kind in enumerate(GRID_KINDS):
                for r in range(repeats):
                    out.append(SimConfig(
                        gpus=gpus, iterations=iterations,
                        seed=GRID_FIRST_SEED + 1000 * r + 100 * i + 10 * p + k,
                        model="llama2-70b" if gpus >= 256 else "llama2-13b",
                        faults=(FaultSpec(kind=kind, severity=0.5, pattern=pattern,
                                          start_iteration=5),)))
    return out


def _grid_rows(truth: np.ndarray, pred: np.ndarray, run_of: np.ndarray, cfgs,
               weight: np.ndarray) -> list[dict]:
    """F1 per (pattern, kind) at each scale of ``cfgs`` (a cell's jobs' rows pooled), then per
    pattern every kind pooled, then every job of a scale pooled (``pattern``/``fault``
    ``all``); the ``all`` column pools a row's cells over the scales. A cell without a job
    (a pattern drawn at some scales only) is None."""
    gpus = np.array([c.gpus for c in cfgs])[run_of]
    pattern = np.array([c.faults[0].pattern for c in cfgs])[run_of]
    kind = np.array([c.faults[0].kind for c in cfgs])[run_of]
    scales = list(dict.fromkeys(c.gpus for c in cfgs))
    patterns = list(dict.fromkeys(c.faults[0].pattern for c in cfgs))
    kinds = list(dict.fromkeys(c.faults[0].kind for c in cfgs))

    def row(pat: str, k: str, keep: np.ndarray) -> dict:
        out: dict = {"pattern": pat, "fault": k}
        for s in scales:
            m = keep & (gpus == s)
            out[str(s)] = _weighted(f1_score, truth[m], pred[m], weight[m]) if m.any() else None
        out["all"] = _weighted(f1_score, truth[keep], pred[keep], weight[keep])
        return out

    rows = [row(pat, k, (pattern == pat) & (kind == k)) for pat in patterns for k in kinds]
    rows += [row(pat, "all", pattern == pat) for pat in patterns]
    rows.append(row("all", "all", np.ones(len(truth), dtype=bool)))
    return rows


#: Rows of each class (abnormal, normal) KNN and the SVM are trained on: their fit and
#: prediction grow faster than the rows, and the default preset has hundreds of thousands of
#: abnormal ones
SMALL_FIT_ROWS = 30_000

#: Other (neither abnormal nor affected) ops scored per held-out job, full run / ``quick``
HELDOUT_OTHER_ROWS: tuple[int, int] = (100_000, 30_000)


def class_sample(y: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of at most ``per_class`` rows drawn without replacement from each class
    of the boolean labels ``y`` (all of a class that has fewer)."""
    y = np.asarray(y, dtype=bool)
    return np.sort(np.concatenate([
        rng.choice(idx, size=min(per_class, len(idx)), replace=False)
        for idx in (np.flatnonzero(y), np.flatnonzero(~y))]))


def heldout_dataset(quick: bool = False, also: tuple[str, ...] = (), columns=None):
    """The rows the bench scores: every abnormal or affected op of :func:`heldout_scenarios`
    plus a seeded sample of :data:`HELDOUT_OTHER_ROWS` others per job, as
    :func:`~holmes_ml.models.training.make_dataset` returns them (with weights; ``also`` and
    ``columns`` as there)."""
    from holmes_ml.models.training import make_dataset

    return make_dataset(heldout_scenarios(quick), max_normal_per_run=HELDOUT_OTHER_ROWS[quick],
                        seed=1, return_weights=True, also=also, columns=columns)


def _weighted(metric, truth: np.ndarray, pred: np.ndarray, weight: np.ndarray) -> float:
    """``metric`` (an sklearn score) of weighted rows, 0 where undefined, to 4 decimals."""
    return round(float(metric(truth, pred, sample_weight=weight, zero_division=0.0)), 4)


def _scores_row(name: str, truth: np.ndarray, pred: np.ndarray, scale_of: np.ndarray,
                scales, weight: np.ndarray | None = None) -> dict:
    """F1 per scale, pooled over every row (``all``) and averaged over the scales (``mean``),
    and pooled precision, of one method's predictions; ``weight`` = ops each row stands for."""
    w = np.ones(len(truth)) if weight is None else np.asarray(weight, dtype=np.float64)
    row: dict = {"method": name}
    for s in scales:
        m = scale_of == s
        row[str(s)] = _weighted(f1_score, truth[m], pred[m], w[m])
    row["mean"] = round(float(np.mean([row[str(s)] for s in scales])), 4)
    row["all"] = _weighted(f1_score, truth, pred, w)
    row["precision"] = _weighted(precision_score, truth, pred, w)
    return row


def _per_run_rows(truth: np.ndarray, pred: np.ndarray, run_of: np.ndarray, cfgs,
                  weight: np.ndarray) -> list[dict]:
    """Precision, recall and F1 of one method on each held-out run, with the run's scale and
    fault: where the misses (recall) and the false alarms (precision) of a scale come from."""
    rows = []
    for i, cfg in enumerate(cfgs):
        m = run_of == i
        t, p, w = truth[m], pred[m], weight[m]
        fault = cfg.faults[0]
        rows.append({
            "gpus": cfg.gpus, "model": cfg.model, "fault": fault.kind, "pattern": fault.pattern,
            "abnormal": int(t.sum()), "precision": _weighted(precision_score, t, p, w),
            "recall": _weighted(recall_score, t, p, w), "f1": _weighted(f1_score, t, p, w),
        })
    return rows


def run(quick: bool = False, methods=()) -> BenchResult:
    """Train every detector on the ``quick``/``default`` mix, report held-out F1 per scale.

    ``methods``: only these and the shipped method (:func:`choose_methods`), e.g. to compare
    a feature change on the shipped method in a fraction of the run's time; the margin over
    the best baseline that ran is then reported only when one did."""
    from holmes_ml.models.training import make_dataset, scenarios

    chosen = choose_methods(tuple(methods))
    t0 = time.perf_counter()
    X, y, run, weight = make_dataset(scenarios("quick" if quick else "default", seed=0),
                                     return_weights=True)
    cfgs = heldout_scenarios(quick)
    scales = tuple(dict.fromkeys(c.gpus for c in cfgs))  # in order, once each
    # KNN prediction is costly on millions of rows: every method is scored on the same rows,
    # all abnormal and affected ops and a weighted sample of the others of each run.
    others_per_run = HELDOUT_OTHER_ROWS[quick]
    Xh, yh, gh, wh, other = heldout_dataset(quick, also=("affected",))
    ya = other["affected"]
    scale_of = np.array([c.gpus for c in cfgs])[gh]
    methods = {name: det for name, det in _methods(quick).items() if name in chosen}
    rng = np.random.default_rng(0)
    small = class_sample(y, SMALL_FIT_ROWS, rng)  # KNN/SVM are quadratic-ish
    rows, rows_affected, fit_s = [], [], {}
    per_run: list[dict] = []
    screen_figures: dict[str, float] = {}
    for name, det in methods.items():
        t = time.perf_counter()
        if name in ("knn", "svm"):
            det.fit(X.iloc[small], y[small])
        elif name.startswith("lgbm") or name == "rf":
            # threshold from out-of-fold scores of held-out runs, sampled normal rows weighted
            det.fit(X, y, groups=run if name != "rf" else None, threshold_weights=weight)
        else:
            det.fit(X, y)
        fit_s[name] = time.perf_counter() - t
        pred = np.asarray(det.predict(Xh)).astype(bool)
        row = _scores_row(name, yh, pred, scale_of, scales, wh)
        rows.append(row)
        # the same predictions against the causal label (every op the fault prolonged at all)
        rows_affected.append(_scores_row(name, ya, pred, scale_of, scales, wh))
        if name == "lgbm":  # the shipped method, run by run
            per_run = _per_run_rows(yh, pred, gh, cfgs, wh)
        if hasattr(det, "passes"):  # screened: what the screen cost the full model
            full = np.asarray(det.detector_.predict(Xh)).astype(bool)
            screen_figures[f"{name}_screen_kept"] = float(
                wh[pred & full].sum() / max(wh[full].sum(), 1e-12))
            screen_figures[f"{name}_screen_pass_share"] = float(
                np.average(det.passes(Xh), weights=wh))
        logger.info("%s: %s", name, row)
    del Xh
    # the shipped method (fitted in place above) on every fault kind at every scale
    grid_cfgs = kind_grid_scenarios(scales, iterations=16 if quick else 24)
    Xg, yg, gg, wg = make_dataset(grid_cfgs, max_normal_per_run=others_per_run, seed=1,
                                  return_weights=True)
    pg = np.asarray(methods["lgbm"].predict(Xg)).astype(bool)
    grid = _grid_rows(yg, pg, gg, grid_cfgs, wg)
    grid_runs = _per_run_rows(yg, pg, gg, grid_cfgs, wg)
    logger.info("lgbm on the kind grid: %s", grid[-1])
    figures = {f"f1_{r['method']}": r["all"] for r in rows}
    figures.update({f"f1_mean_over_scales_{r['method']}": r["mean"] for r in rows})
    figures.update({f"f1_affected_{r['method']}": r["all"] for r in rows_affected})
    shipped = next(r for r in rows if r["method"] == "lgbm")
    figures.update({f"f1_lgbm_gpus_{s}": shipped[str(s)] for s in scales})
    figures.update({f"f1_lgbm_grid_gpus_{s}": grid[-1][str(s)] for s in scales})
    figures["f1_lgbm_grid_mean_over_scales"] = round(
        float(np.mean([grid[-1][str(s)] for s in scales])), 4)
    figures.update(screen_figures)
    figures["seconds"] = time.perf_counter() - t0
    supervised = [m for m in SUPERVISED if m in chosen]
    if any(m in chosen for m in BASELINES):
        best_baseline = max(r["all"] for r in rows if r["method"] in BASELINES)
        figures["margin_over_best_baseline"] = (
            max(figures[f"f1_{m}"] for m in supervised) - best_baseline)
    return BenchResult(
        name="detector",
        figures=figures,
        config={"quick": quick, "methods": list(chosen), "scales": list(scales),
                "train_rows": int(len(y)),
                "train_abnormal": int(y.sum()), "heldout_ops": round(float(wh.sum())),
                "heldout_scored_rows": int(len(yh)),
                "heldout_abnormal": int(yh.sum()), "heldout_affected": int(ya.sum()),
                "heldout_abnormal_per_scale": {str(s): int(yh[scale_of == s].sum())
                                               for s in scales},
                "heldout_other_rows_per_run": others_per_run,
                "grid_jobs": len(grid_cfgs), "grid_scored_rows": int(len(yg)),
                "grid_abnormal": int(yg.sum()),
                "label": "abnormal: prolonged by the fault beyond the fault-free spread of the "
                         "same op step (median + 3 robust std devs); affected: prolonged by "
                         "> 15 % + 20 us at all (see holmes_ml.simulator.engine)"},
        details={"fit_seconds": fit_s, "grid_runs": grid_runs},
        goals={**{f"f1_{m}": ">= 0.95" for m in supervised},
               **{f"f1_lgbm_gpus_{s}": ">= 0.95" for s in scales},
               **{f"f1_lgbm_grid_gpus_{s}": ">= 0.95" for s in scales}},
        tables={"op-level F1 by scale (held-out)": rows,
                "same predictions scored against `affected` (causal label)": rows_affected,
                "shipped method (lgbm) per held-out run": per_run,
                "shipped method (lgbm) by fault kind, pattern and scale (F1; one job per cell, "
                "every kind at every scale)": grid},
    )
