"""Training data from simulator scenarios, and the reproducible default model.

:func:`scenarios` lists a seeded mix of simulator configurations (scales, model presets and
layouts, fault kinds and patterns, healthy runs, jitter, drift); :func:`make_dataset` simulates
them and returns features and labels; :func:`train_default` builds the shipped model.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

__all__ = ["MIXES", "PRESETS", "PRESET_MIXES", "SCALE_DEPENDENT", "absolute_estimator",
           "default_estimator", "make_dataset", "scale_free_estimator", "scenarios",
           "small_estimator", "train_default"]

#: Feature columns the shipped detector ignores: absolute microsecond statistics (their values
#: move with model size, message size and GPU count, so splits learned at one scale misfire at
#: another) and job-level context whose tiny variations the trees latched onto (e.g. an
#: ``iter_time_ratio`` of 1.003 flagging thousands of ops of a 256-GPU run). ``duration_us``
#: stays: the label's +20 us floor makes absolute duration informative for very short ops.
SCALE_DEPENDENT: tuple[str, ...] = (
    "hist_mean_us", "hist_std_us", "hist_q1_us", "hist_median_us", "hist_q3_us", "hist_iqr_us",
    "peer_median_us", "arrival_lag_us", "rank_window_mean_us", "wait_us", "xfer_us",
    "iter_time_ratio", "rank_latency_ratio", "history_len",
)

_KINDS = ("gpu_slow", "nic_slow", "link_slow", "switch_congested", "host_stall")
_PATTERNS = ("persistent", "spike", "fluctuation")
_MODELS = ("llama2-7b", "llama2-13b", "llama2-70b", "mixtral-8x7b")

#: 16 runs per scale: one healthy and 15 faulty, the 5 kinds in the 3 patterns, so that every
#: (kind, pattern) meets every scale (with 6 it met one or two: ``scripts/coverage_check.py``)
_DEFAULT_SHAPE = ((64, 128, 256, 512, 1024), 16, 20)
#: preset -> (scales, runs per scale, iterations) of each of its mixes
PRESETS: dict[str, tuple[tuple[int, ...], int, int]] = {
    "default": _DEFAULT_SHAPE,
    "plain": _DEFAULT_SHAPE,
    "quick": ((64, 128), 4, 20),
    "tiny": ((64,), 3, 16),
}

#: Knob ranges of a mix of runs: ``plain`` (compute jitter 1-6 %, no transfer drift, fault
#: severities 0.2-0.9), ``noisy`` (jitter up to 10 %, transfers up to 20 % slower by the end:
#: the clusters that ``holmes bench localize`` draws its healthy and noisy sweeps from) and
#: ``mild`` (the plain clusters with faults of severity 0.08-0.35: small enough that many of
#: the copies they lengthen lie near the label's 15 % line, as a severity-0.5 slow GPU leaves
#: the reduce-scatters of a 128-member data-parallel group, so the trees see copies on both
#: sides of it).
MIXES: dict[str, dict[str, tuple[float, ...]]] = {
    "plain": {"jitter": (0.01, 0.06), "comm_drift": (0.0,), "severity": (0.2, 0.9)},
    "noisy": {"jitter": (0.01, 0.10), "comm_drift": (0.0, 0.0, 0.1, 0.2),
              "severity": (0.2, 0.9)},
    "mild": {"jitter": (0.01, 0.06), "comm_drift": (0.0,), "severity": (0.08, 0.35)},
}

#: preset -> the mixes it draws, in this order, each over every scale of :data:`PRESETS`.
#: ``default`` (the bundled model's) draws the plain runs, then as many noisy ones, then as
#: many mild ones: with the lowest-level columns (``FeatureConfig.level_memory``) a model that
#: never saw transfers drift takes a drifting level for a persistent fault, and names NICs and
#: links on healthy noisy clusters; one that never saw mild faults misses the copies a fault
#: lengthens by little more than the label's 15 %, which a persistent slow GPU leaves on
#: LLaMA2-70B at 1,024 GPUs and more. ``plain`` is the plain runs alone (the bundled model's
#: mix, at 6 runs per scale, until the level columns came; docs/results.md says what each mix
#: gives).
PRESET_MIXES: dict[str, tuple[str, ...]] = {
    "default": ("plain", "noisy", "mild"),
    "plain": ("plain",),
    "quick": ("plain",),
    "tiny": ("plain",),
}


def scenarios(preset: str = "default", seed: int = 0,
              scales: tuple[int, ...] | None = None) -> list[Any]:
    """Seeded list of :class:`~holmes_ml.simulator.SimConfig` for a training preset.

    For each mix of :data:`PRESET_MIXES` (each with its own random stream), each scale gets
    one healthy run and faulty runs cycling through fault kinds and patterns, with varied
    model presets, jitter and drift (ranges in :data:`MIXES`) and severities. Simulator seeds
    are ``seed * 1000`` plus the run's place in the list. ``scales`` (GPU counts) replaces the
    preset's own: the runs of a scale both lists hold stay as they were in the first mix, while
    a later mix's simulator seeds move with the number of runs before it.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset: got {preset!r}; expected one of {sorted(PRESETS)}")
    shape = PRESETS[preset]
    if scales is not None:
        if not scales or min(scales) < 1:
            raise ValueError(f"scales: got {scales!r}; expected GPU counts of 1 or more")
        shape = (tuple(scales), *shape[1:])
    out: list[Any] = []
    for i, mix in enumerate(PRESET_MIXES[preset]):
        # the first mix keeps the stream (so the runs) the presets always had
        rng = np.random.default_rng(seed if i == 0 else (seed, i))
        out += _mix(shape, MIXES[mix], rng, seed, first=len(out))
    return out


def _mix(shape: tuple[tuple[int, ...], int, int], knobs: dict[str, tuple[float, ...]],
         rng: np.random.Generator, seed: int, first: int) -> list[Any]:
    """One mix's runs (see :func:`scenarios`); their simulator seeds continue from ``first``."""
    from holmes_ml.simulator import FaultSpec, SimConfig

    scales, runs, iters = shape
    lo, hi = knobs["jitter"]
    weakest, strongest = knobs["severity"]
    comm = knobs["comm_drift"]
    out: list[Any] = []
    k = 0
    for gpus in scales:
        for r in range(runs):
            model = _MODELS[int(rng.integers(len(_MODELS)))]
            if model == "mixtral-8x7b" and gpus < 128:
                model = "llama2-13b"
            faults: tuple = ()
            if r > 0:
                kind = _KINDS[k % len(_KINDS)]
                pattern = _PATTERNS[(k // len(_KINDS)) % len(_PATTERNS)]
                k += 1
                sev = float(rng.uniform(weakest, strongest))
                start = int(rng.integers(3, iters // 2))
                faults = (FaultSpec(kind=kind, pattern=pattern, severity=sev,
                                    start_iteration=start),)
            jitter = float(rng.uniform(lo, hi))
            drift = float(rng.choice([0.0, 0.0, 0.1, 0.2]))
            # a one-value range draws nothing: the plain mix's stream is what it always was
            comm_drift = float(rng.choice(comm)) if len(comm) > 1 else float(comm[0])
            out.append(SimConfig(
                gpus=gpus, model=model, iterations=iters, faults=faults,
                seed=int(seed * 1000 + first + len(out)),
                jitter=jitter, drift=drift, comm_drift=comm_drift,
            ))
    return out


def make_dataset(
    configs: list[Any], max_normal_per_run: int | None = 20_000, seed: int = 0,
    return_weights: bool = False, also: tuple[str, ...] = (), progress: bool = False,
    columns: Callable[[Any], pd.DataFrame] | None = None,
) -> Any:
    """Simulate ``configs`` and return ``(features, labels, run_id)``.

    Normal ops of large runs are subsampled to ``max_normal_per_run`` so big scales do not
    swamp the mix. Abnormal ops are all kept, and so are the normal ops the fault prolonged
    without taking them outside the normal range (``affected`` but not ``abnormal``): they are
    the negatives closest to the boundary, which a uniform sample would mostly drop. With
    ``return_weights`` a fourth array says how many ops of its run each row stands for (1 for
    the rows kept for sure, ``other normal ops / those kept`` for the sampled ones): the
    weights that turn F1 on these rows into F1 on the whole runs.
    ``also`` names other label columns (e.g. ``("affected",)``) returned, for the same rows, as a
    last element: a dict of arrays. ``progress`` shows a bar over the scenarios. ``columns``
    adds feature columns of one's own: called with each run's simulation result, it returns a
    frame of them, one row per op in the result's order, placed after the detector's columns.
    """
    from tqdm.auto import tqdm

    from holmes_ml.features import build_features
    from holmes_ml.simulator import simulate

    rng = np.random.default_rng(seed)
    Fs, ys, ids, ws = [], [], [], []
    extra: dict[str, list[np.ndarray]] = {name: [] for name in also}
    for i, cfg in enumerate(tqdm(configs, desc="scenarios", unit="run", disable=not progress)):
        try:
            res = simulate(cfg)
        except ValueError as exc:  # a layout the preset cannot host: skip, but say so
            logger.warning("skipping scenario %d (%s)", i, exc)
            continue
        F = build_features(res.ops)
        if columns is not None:
            F = pd.concat([F.reset_index(drop=True), columns(res).reset_index(drop=True)],
                          axis=1)
        y = res.ops["abnormal"].to_numpy(dtype=bool)
        # kept for sure: abnormal, and affected (normal but prolonged by the fault)
        sure = (y | res.ops["affected"].to_numpy(dtype=bool)) if "affected" in res.ops else y
        keep = np.ones(len(y), dtype=bool)
        if max_normal_per_run is not None and (~sure).sum() > max_normal_per_run:
            other = np.flatnonzero(~sure)
            drop = rng.choice(other, size=len(other) - max_normal_per_run, replace=False)
            keep[drop] = False
        Fs.append(F[keep].reset_index(drop=True))
        ys.append(y[keep])
        ids.append(np.full(int(keep.sum()), i))
        other_weight = (~sure).sum() / max(int((~sure & keep).sum()), 1)
        ws.append(np.where(sure[keep], 1.0, other_weight))
        for name in also:
            extra[name].append(res.ops[name].to_numpy(dtype=bool)[keep])
        logger.info("scenario %d: %d ops, %d abnormal", i, len(y), int(y.sum()))
    out: tuple = (pd.concat(Fs, ignore_index=True), np.concatenate(ys), np.concatenate(ids))
    if return_weights:
        out = (*out, np.concatenate(ws))
    if also:
        out = (*out, {name: np.concatenate(parts) for name, parts in extra.items()})
    return out


def default_estimator(random_state: int = 0, screened: bool = True) -> Any:
    """The configuration of the shipped detector: :func:`scale_free_estimator` (100 LightGBM
    trees of 31 leaves on the scale-free columns) behind a 30-tree screen that hands it only
    the rows it cannot rule out (:class:`~holmes_ml.models.ScreenedDetector`;
    ``screened=False`` gives the bare trees)."""
    from holmes_ml.models.screen import ScreenedDetector, default_screen

    det = scale_free_estimator(random_state)
    if not screened:
        return det
    return ScreenedDetector(det, screen=default_screen(random_state), keep=0.999)


def absolute_estimator(random_state: int = 0) -> Any:
    """100 LightGBM trees of 31 leaves on every column, absolute microseconds included, with
    balanced class weights: the shipped configuration until its threshold was picked on
    re-weighted rows (``threshold_weights``), with which it falls behind the scale-free one."""
    from holmes_ml.models.detectors import LightGBMDetector

    return LightGBMDetector(n_estimators=100, num_leaves=31, learning_rate=0.08,
                            colsample_bytree=0.8, threshold="auto", random_state=random_state)


def scale_free_estimator(random_state: int = 0) -> Any:
    """100 LightGBM trees of 31 leaves without the scale-dependent columns
    (:data:`SCALE_DEPENDENT`) and without class re-weighting: the shipped detector's trees.

    Absolute microsecond columns let trees learn splits that hold at one job size and misfire
    at another; without them the model generalizes across scales (``holmes bench detector``).
    Its scores are unbalanced probabilities, so its ``"auto"`` threshold must be picked with
    the training rows weighted back to their runs (``threshold_weights``) or it flags far too
    many normal ops.
    """
    from holmes_ml.models.detectors import LightGBMDetector

    return LightGBMDetector(n_estimators=100, num_leaves=31, learning_rate=0.08,
                            colsample_bytree=0.8, threshold="auto", class_weight=None,
                            ignore_features=SCALE_DEPENDENT, random_state=random_state)


def small_estimator(random_state: int = 0) -> Any:
    """The scale-free configuration shrunk for throughput: 30 trees of depth 3.

    Inference cost grows with the number of tree nodes visited per row; 30 depth-3 trees visit
    90 instead of ~500 for :func:`scale_free_estimator`, and are small enough to be scored
    column-wise with numpy (:mod:`holmes_ml.models._compiled`). Measured on the quick held-out
    mix: about 0.005-0.02 F1 below :func:`scale_free_estimator` (``holmes bench detector``, row
    ``lgbm-small``) for ~8x the scored rows per CPU second.
    """
    from holmes_ml.models.detectors import LightGBMDetector

    return LightGBMDetector(n_estimators=30, num_leaves=7, max_depth=3, learning_rate=0.27,
                            colsample_bytree=0.8, threshold="auto", class_weight=None,
                            ignore_features=SCALE_DEPENDENT, random_state=random_state)


def takes_groups(det: Any) -> bool:
    """Does ``det.fit`` take ``groups`` (a run id per row) for folds that leave runs out?"""
    import inspect

    return "groups" in inspect.signature(det.fit).parameters


def train_default(
    out: str | Path, preset: str = "default", seed: int = 0, estimator: Any = None,
    progress: bool = False, extra: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Train on ``preset`` scenarios (seed ``seed``), evaluate on held-out seed, save to ``out``
    (``progress``: bars over the scenarios simulated; ``extra``: more facts for the
    envelope's header, e.g. the command's options).

    Returns
    -------
    dict
        Metrics stored in the envelope: held-out F1, precision, recall, rows.
    """
    from sklearn.metrics import f1_score, precision_score, recall_score

    from holmes_ml.models.persist import save_model

    X, y, run, weight = make_dataset(scenarios(preset, seed), seed=seed, return_weights=True,
                                     progress=progress)
    if progress:
        print(f"fitting on {len(y):,} operators ({int(y.sum()):,} abnormal) ...",
              file=sys.stderr, flush=True)
    det = estimator if estimator is not None else default_estimator(seed)
    # groups: the decision threshold is picked on out-of-fold scores of held-out *runs*, with
    # the subsampled normal rows weighted back to their share of the runs
    det = (det.fit(X, y, groups=run, threshold_weights=weight) if takes_groups(det)
           else det.fit(X, y))
    Xh, yh, _, wh = make_dataset(scenarios("tiny", seed + 1), seed=seed + 1,
                                 return_weights=True)
    pred = det.predict(Xh).astype(bool)
    metrics = {  # on the held-out runs' ops (sampled normal rows weighted back)
        "heldout_f1": f1_score(yh, pred, sample_weight=wh),
        "heldout_precision": precision_score(yh, pred, sample_weight=wh, zero_division=0.0),
        "heldout_recall": recall_score(yh, pred, sample_weight=wh),
        "train_rows": float(len(y)),
        "train_abnormal": float(y.sum()),
    }
    save_model(det, out, metrics=metrics, training_data=(X, y),
               extra={**(extra or {}), "preset": preset, "seed": seed})
    return metrics
