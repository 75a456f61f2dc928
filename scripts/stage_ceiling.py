"""Does the stage-step crowd hold the copies the label's ceiling is set on?

The ``abnormal`` label calls a copy abnormal only above its op step's fault-free copies on its
pipeline stage (median + 3 robust standard deviations, in the job's fault-free twin). For each of
the bench's held-out jobs named (``--run``, 0-9), this re-simulates the job with the twin's
durations kept (``label_reach``'s hook on the engine), groups every copy by the op step and its
place in the rank's iteration, with and without the stage ``build_features`` reads off the
communicators (:func:`holmes_ml.features.build._stage_of`), and prints for each grouping:

* ``ceiling``: the share of copies whose grouping, applied to the twin, gives the label's own
  ceiling (within 0.1 %);
* ``label_f1``: F1 of "affected and more than 3 robust standard deviations above the faulty job's
  median of its grouping" against the label (what a log can reach with that crowd);
* per communicator kind and op, the area under the ROC curve of that z-score between the abnormal
  copies a detector misses (``--model``, default the bundled one) and the normal copies as far
  out as them by the place-only z-score, ``stage_step_z`` as it was before the stage (0.5: no
  separation).

``--spreads`` prints, per job, ``label_f1`` by place and stage with other medians and spreads in
the rule's place: the fault-free twin's spread (what the label uses), the median and spread of the
copies the fault did not touch (``affected`` false), those of the copies left after setting aside
the ones more than 2 (or 1.5) robust standard deviations above the median (one pass of upper sigma
clipping, which a log can do), and those of the copies the detector does not flag (the whole
crowd's where it flags every copy; ``scripts/context_stack.py --cleaned-crowd`` gives a second
detector that crowd). Each rule is also scored with the multiplier (1.5-4 robust standard
deviations, steps of 0.25) that suits it best on that job: a crowd that reaches a higher F1 at 3
only because it moves the cut may be matched by the faulty crowd at another multiplier. Last, the
detector's F1 over every copy of the job at its own threshold and at the threshold best for that
job (which no threshold set before seeing the job can beat), and how well its score ranks the
copies the fault touched among those beyond 2.5 robust standard deviations.

Usage: ``.venv/bin/python scripts/stage_ceiling.py --run 2 4 6`` (the persistent NIC, link and
switch jobs; about 10 seconds each, 4,096 GPUs a minute). The misses of the model before the
stage, on the columns it knew: ``git show d6c0881:holmes_ml/data/default-model.holmes >
/tmp/old.holmes`` and ``--model /tmp/old.holmes --place-only``.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from label_reach import _frame_with_twin
from sklearn.metrics import f1_score, roc_auc_score

from holmes_ml.bench.detector import heldout_scenarios
from holmes_ml.features import FEATURE_COLUMNS, GROUP_KIND_CODES, build_features
from holmes_ml.features.build import _stage_of
from holmes_ml.models import best_f1_threshold, default_model, load_model
from holmes_ml.simulator import simulate
from holmes_ml.simulator.engine import Engine

#: a copy's stage step (``stage_step_z``'s crowd): the op step (iteration, group kind, op, place in
#: the group's sequence, bytes) at the same place of the rank's iteration on the same pipeline stage
STAGE_STEP = ["it", "kind", "op", "seqrel", "nb", "place", "stage"]


def step_frame(ops: pd.DataFrame) -> pd.DataFrame:
    """Per op of a simulated job (in its order), the columns of :data:`STAGE_STEP` (the stage as
    ``build_features`` reads it off the communicators, without its fallback for small crowds),
    with the rank, the group's code, the start and the duration."""
    g = ops["group"].cat.codes.to_numpy().astype(np.int64)
    df = pd.DataFrame({
        "it": ops["iteration"].to_numpy(), "rank": ops["rank"].to_numpy(), "g": g,
        "kind": ops["group_kind"].astype(str).to_numpy(), "op": ops["op"].astype(str).to_numpy(),
        "seq": ops["seq"].to_numpy(), "nb": ops["nbytes"].to_numpy(),
        "start": ops["start_ns"].to_numpy(), "dur": ops["duration_us"].to_numpy()})
    kind = df["kind"].map(GROUP_KIND_CODES).fillna(GROUP_KIND_CODES["other"])
    df["stage"] = _stage_of(df["rank"].to_numpy(), g, kind.to_numpy(dtype=np.int64))
    df["seqrel"] = df["seq"] - df.groupby(["it", "g"])["seq"].transform("min")
    df["place"] = df.groupby(["it", "rank"])["start"].rank(method="first")
    return df


def robust_z(df: pd.DataFrame, key: list[str], col: str,
             among: pd.Series | None = None) -> tuple[pd.Series, pd.Series]:
    """Per row, the median and robust standard deviation of ``col`` over its ``key`` group
    (1.4826 x MAD, floored at 1 % of the median, as the label and ``build_features`` do);
    with ``among``, over the group's rows where it is true."""
    by = [df[k] for k in key]
    values = df[col] if among is None else df[col].where(among)
    med = values.groupby(by).transform("median")
    mad = (values - med).abs().groupby(by).transform("median")
    return med, np.maximum(1.4826 * mad, 0.01 * med)


def label_f1(df: pd.DataFrame, med: pd.Series, sd: pd.Series, times: float = 3.0) -> float:
    """F1 against the label of "affected and more than ``times`` ``sd`` above ``med``"."""
    return float(f1_score(df["abnormal"], df["affected"] & (df["dur"] > med + times * sd)))


#: multipliers of the robust standard deviation ``--spreads`` tries for each rule
MULTIPLIERS = np.arange(1.5, 4.01, 0.25)


def spreads(df: pd.DataFrame, key: list[str], fmed: pd.Series, fsd: pd.Series,
            csd: pd.Series, flagged: np.ndarray) -> None:
    """``label_f1`` of "affected and 3 robust std above the median" with other medians and
    spreads of the copy's stage step (see ``--spreads``); ``fmed``, ``fsd``: the faulty job's
    median and spread over ``key``, ``csd`` the twin's spread, ``flagged`` the detector's
    verdicts."""
    rules = {"faulty median and spread": (fmed, fsd), "faulty median, twin's spread": (fmed, csd),
             "copies the fault did not touch": robust_z(df, key, "dur", ~df["affected"])}
    for clip in (2.0, 1.5):
        rules[f"clipped at {clip} robust std"] = robust_z(df, key, "dur",
                                                           df["dur"] <= fmed + clip * fsd)
    med, sd = robust_z(df, key, "dur", pd.Series(~flagged, index=df.index))
    rules["copies the detector calls normal"] = (med.fillna(fmed), sd.fillna(fsd))
    for name, (med, sd) in rules.items():
        best = max((label_f1(df, med, sd, float(t)), float(t)) for t in MULTIPLIERS)
        print(f"    {name:>32}: label_f1 {label_f1(df, med, sd):.3f}  "
              f"at its best multiplier ({best[1]:.2f}) {best[0]:.3f}")
    missed = df["abnormal"] & ~(df["dur"] > fmed + 3 * fsd)
    touched = df["affected"].groupby([df[k] for k in key]).transform("mean")
    print(f"    abnormal copies the first rule misses: {int(missed.sum())}; median over them of "
          f"the faulty spread over the twin's {(fsd / csd)[missed].median():.2f}, of the share "
          f"of their crowd the fault touched {touched[missed].median():.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, nargs="+", default=[2, 4, 6],
                        help="held-out jobs 0-9 (default 2 4 6)")
    parser.add_argument("--model", help="model envelope whose misses are profiled (default: "
                        "the bundled model)")
    parser.add_argument("--place-only", action="store_true",
                        help="give that model the stage_step_* columns as they were before the "
                             "stage was read off the communicators (every rank in stage 0)")
    parser.add_argument("--spreads", action="store_true",
                        help="also label_f1 by place and stage with other medians and spreads "
                             "(the twin's, the untouched copies', after upper sigma clipping), "
                             "each at 3 and at its best multiplier, and the detector's F1 at its "
                             "own and at the job's best threshold")
    args = parser.parse_args()
    cfgs = heldout_scenarios()
    bad = [r for r in args.run if not 0 <= r < len(cfgs)]
    if bad:
        parser.error(f"--run: got {bad[0]}; expected 0-{len(cfgs) - 1}")
    Engine._frame = _frame_with_twin
    if args.place_only:
        import holmes_ml.features.build as build

        build._stage_of = lambda rank0, gcode, kind_code: np.zeros(len(rank0), dtype=np.int64)
    model = load_model(args.model) if args.model else default_model()
    for r in args.run:
        cfg = cfgs[r]
        fault = cfg.faults[0]
        print(f"job {r}: {cfg.gpus} GPUs, {cfg.model}, {fault.kind} {fault.pattern}")
        ops = simulate(cfg).ops
        # the detector's score once; its verdict is the score against its threshold (predict)
        score = np.asarray(model.decision_function(
            build_features(ops).loc[:, list(FEATURE_COLUMNS)]), dtype=np.float64)
        flagged = score >= model.threshold_
        df = step_frame(ops)
        for col, name in (("clean", "clean_duration_us"), ("usual", "clean_step_usual_us"),
                          ("abnormal", "abnormal"), ("affected", "affected")):
            df[col] = ops[name].to_numpy()
        missed = df["abnormal"] & ~flagged
        place_z = None
        for name, key in {"place": STAGE_STEP[:-1], "place + stage": STAGE_STEP}.items():
            cmed, csd = robust_z(df, key, "clean")
            fmed, fsd = robust_z(df, key, "dur")
            z = (df["dur"] - fmed) / fsd
            place_z = z.to_numpy() if place_z is None else place_z
            ceiling = np.isclose(cmed + 3 * csd, df["usual"], rtol=1e-3).mean()
            print(f"  {name:>13}: ceiling {ceiling:.3f}  label_f1 {label_f1(df, fmed, fsd):.3f}")
            for (k, o), n in df[missed].groupby(["kind", "op"]).size().items():
                same = ((df["kind"] == k) & (df["op"] == o)).to_numpy()
                m = same & missed.to_numpy()
                far = same & ~df["abnormal"].to_numpy() & (place_z >= np.median(place_z[m]))
                if n < 10 or not far.any():
                    continue
                sel = m | far
                auc = roc_auc_score(df["abnormal"].to_numpy()[sel], z.to_numpy()[sel])
                print(f"      {k} {o}: missed {n}, normal as far out {int(far.sum())}, "
                      f"AUC {auc:.3f}")
        if args.spreads:  # the last grouping's (place and stage) medians and spreads
            spreads(df, key, fmed, fsd, csd, flagged)
            cut = best_f1_threshold(df["abnormal"], score)
            print(f"    the detector (every copy): F1 {f1_score(df['abnormal'], flagged):.4f} at "
                  f"its threshold, {f1_score(df['abnormal'], score >= cut):.4f} at the best one "
                  f"for this job ({cut:.3f})")
            far = (df["dur"] > fmed + 2.5 * fsd).to_numpy()
            print(f"    copies beyond 2.5 robust std: {int(far.sum())}, {df['affected'][far].mean():.3f}"
                  f" affected; the detector's score ranks those above the others with area under "
                  f"the ROC curve {roc_auc_score(df['affected'][far], score[far]):.3f}")


if __name__ == "__main__":
    main()
