"""Op-level F1 of the detector, of the "3σ + rule" baseline, and of their union (what
localization flags), over every op of ``holmes bench detector``'s held-out jobs.

The union is what :func:`holmes_ml.pipeline.summarize` reports as abnormal (``with_rule``); the
bench scores the detector alone. This shows what the union costs against the op-level label.

Usage: ``.venv/bin/python scripts/union_f1.py 64 256 1024`` (held-out scales to score; about 1
minute for these three on 2 cores, 4,096 and 8,192 take far longer and more memory).
"""

from __future__ import annotations

import sys
import time

from sklearn.metrics import f1_score, precision_score, recall_score

from holmes_ml.bench.detector import heldout_scenarios
from holmes_ml.localize import LocalizeConfig
from holmes_ml.models import default_model
from holmes_ml.pipeline import _class_stats, _op_classes, _rank_spans, _regular_rows, _score
from holmes_ml.simulator import simulate


def main() -> None:
    want = {int(a) for a in sys.argv[1:]} or {64, 256, 1024}
    model, cfg = default_model(), LocalizeConfig()
    pooled: dict[tuple[int, str], list[int]] = {}
    for i, c in enumerate(heldout_scenarios()):
        if c.gpus not in want:
            continue
        t = time.perf_counter()
        res = simulate(c)
        y = res.ops["abnormal"].to_numpy(bool)
        ops = res.ops.drop(columns=["abnormal", "affected"]).reset_index(drop=True)
        classes = _op_classes(ops)
        stats = _class_stats(ops, classes, _regular_rows(ops, cfg, _rank_spans(ops)))
        ml, thr = _score(ops, model, LocalizeConfig(with_rule=False), classes, stats)
        flags = {"model": ml >= thr,
                 "rule": _score(ops, "rule", cfg, classes, stats)[0] >= 0.5,
                 "union": _score(ops, model, cfg, classes, stats)[0] >= 0.5}
        parts = []
        for name, p in flags.items():
            parts.append(f"{name} P {precision_score(y, p, zero_division=0):.3f} "
                         f"R {recall_score(y, p, zero_division=0):.3f} "
                         f"F1 {f1_score(y, p, zero_division=0):.3f}")
            acc = pooled.setdefault((c.gpus, name), [0, 0, 0])
            acc[0] += int((p & y).sum())
            acc[1] += int(p.sum())
            acc[2] += int(y.sum())
        f = c.faults[0] if c.faults else None
        print(i, c.gpus, c.model, f.kind if f else "-", f.pattern if f else "-", len(y),
              int(y.sum()), " | ".join(parts), f"{time.perf_counter() - t:.0f} s", flush=True)
    for (gpus, name), (tp, flagged, positive) in sorted(pooled.items()):
        print(gpus, name, f"F1 {2 * tp / max(flagged + positive, 1):.4f}")


if __name__ == "__main__":
    main()
