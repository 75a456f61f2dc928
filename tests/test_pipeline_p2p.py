"""Point-to-point evidence: a send slowed from the first step on is still abnormal."""

from __future__ import annotations

import numpy as np
import pandas as pd

from holmes_ml.pipeline import rule_scores

PAIRS = 6  # sender rank s sends to s + PAIRS


def _p2p_ops(slow_sender: int, factor: float, iterations: int = 6, seed: int = 0) -> pd.DataFrame:
    """Each iteration every sender sends 4 microbatches; receives wait a stage-dependent time."""
    rng = np.random.default_rng(seed)
    rows = []
    t = 10**9
    for it in range(iterations):
        for mb in range(4):
            for s in range(PAIRS):
                d = PAIRS + s
                xfer = 1000.0 * (1 + 0.03 * rng.standard_normal())
                if s == slow_sender:
                    xfer *= factor
                wait = float(rng.uniform(0, 20_000))  # the receive was posted early
                start = t + (it * 4 + mb) * 3 * 10**6  # back-to-back microbatches
                group = f"pp-{s}-{d}"
                rows.append((it, s, "send", group, it * 4 + mb, 1 << 20, start, xfer, d))
                rows.append((it, d, "recv", group, it * 4 + mb, 1 << 20,
                             start - int(wait * 1e3), wait + xfer, s))
    cols = ["iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us",
            "peer"]
    df = pd.DataFrame(rows, columns=cols)
    return df.assign(group_kind="pp").sample(frac=1.0, random_state=seed).reset_index(drop=True)


def test_send_slow_from_the_first_step_is_abnormal() -> None:
    ops = _p2p_ops(slow_sender=2, factor=2.0)
    score = rule_scores(ops)
    flagged = ops[score >= 0.5]
    slow_sends = (ops["op"] == "send") & (ops["rank"] == 2)
    # Every send of the slow sender is flagged although its own history is slow throughout...
    assert (score[slow_sends.to_numpy()] >= 0.5).all()
    # ...and no healthy sender's send is.
    assert set(flagged.loc[flagged["op"] == "send", "rank"]) == {2}


def test_healthy_sends_are_not_abnormal() -> None:
    ops = _p2p_ops(slow_sender=-1, factor=1.0, seed=3)
    score = rule_scores(ops)
    assert (score[(ops["op"] == "send").to_numpy()] < 0.5).all()

