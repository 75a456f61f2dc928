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



def _pair_allreduce_ops(slow_pair: int, factor: float, iterations: int = 8,
                        seed: int = 0) -> pd.DataFrame:
    """Eight 2-rank groups all-reduce once per step. In every group one member arrives up to
    100 ms late (compute jitter), so half the copies of the class are long waits; group
    ``slow_pair``'s transfer is ``factor`` x slower from the first step on."""
    rng = np.random.default_rng(seed)
    rows = []
    for it in range(iterations):
        for g in range(8):
            xfer = 1000.0 * (1 + 0.03 * rng.standard_normal()) * (factor if g == slow_pair else 1)
            a, b = 2 * g, 2 * g + 1
            arrive = {a: 0.0, b: float(rng.uniform(0, 100_000))}
            last = max(arrive.values())
            for r, t in arrive.items():
                rows.append((it, r, "all_reduce", f"dp-{g}", it, 1 << 20,
                             10**9 + it * 10**9 + int(t * 1e3), last - t + xfer, -1, f"{a} {b}"))
    return pd.DataFrame(rows, columns=["iteration", "rank", "op", "group", "seq", "nbytes",
                                       "start_ns", "duration_us", "peer", "group_ranks"])


def test_collective_slow_from_the_first_step_flags_every_copy() -> None:
    ops = _pair_allreduce_ops(slow_pair=3, factor=30.0)
    score = rule_scores(ops)
    slow = (ops["group"] == "dp-3").to_numpy()
    # the last arrival's copy is the transfer alone: 30x the others' -> every copy is abnormal,
    # although the waits of the class spread far wider than that
    assert (score[slow] >= 0.5).all()
    assert (score[~slow] < 0.5).mean() > 0.9


def test_collective_jittered_arrivals_alone_flag_no_transfer() -> None:
    ops = _pair_allreduce_ops(slow_pair=-1, factor=1.0, seed=2)
    score = rule_scores(ops)
    assert (score < 0.5).mean() > 0.9
