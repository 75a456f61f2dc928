"""The "3σ + rule" baseline reads the job's own compute jitter: on a noisy cluster partners wait
longer for each other, and a fixed fraction of the compute gap would call those waits abnormal."""

from __future__ import annotations

from dataclasses import replace

import pytest

from holmes_ml.io.schema import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import analyze, compute_jitter, rule_scores
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

LAYOUTS = [
    dict(model="llama2-7b", tp=2, pp=2),
    dict(model="llama2-7b", tp=2, pp=1),
    dict(model="mixtral-8x7b", tp=2, pp=2, ep=2, cp=2),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["3-D", "2-D", "5-D"])
@pytest.mark.parametrize("jitter", [0.01, 0.03, 0.1])
def test_compute_jitter_reads_the_simulated_sigma(layout, jitter):
    # a slow GPU and drift are there too: neither is jitter
    res = simulate(SimConfig(gpus=128, iterations=4, seed=3, jitter=jitter, drift=0.2,
                             comm_drift=0.2, **layout,
                             faults=(FaultSpec.parse("gpu_slow:severity=0.5,start=1"),)))
    assert compute_jitter(without_labels(res.ops)) == pytest.approx(jitter, rel=0.15)


@pytest.mark.parametrize("jitter", [0.01, 0.1])
def test_a_pairs_persistent_straggler_is_not_jitter(jitter):
    # Two ranks: the median of a pair is its mean, so a member late at every step once looked
    # like both members' jitter (0.7 here, whatever the real one) and raised the bar above its
    # own partner's waits.
    pair = SimConfig(gpus=2, model="llama2-7b", tp=1, pp=1, iterations=12, seed=3, jitter=jitter)
    healthy = compute_jitter(without_labels(simulate(pair).ops))
    slow = simulate(replace(pair, faults=(
        FaultSpec.parse("gpu_slow:rank=1,severity=1.0,start=3"),)))
    assert compute_jitter(without_labels(slow.ops)) <= 2 * healthy + 0.01


def test_compute_jitter_without_collectives_is_zero():
    ops = without_labels(simulate(SimConfig(gpus=32, model="llama2-7b", iterations=2)).ops)
    assert compute_jitter(ops[ops["op"].isin(["send", "recv"])]) == 0.0


NOISY = SimConfig(gpus=64, model="llama2-7b", tp=2, pp=2, iterations=8, seed=4, jitter=0.1)


def test_a_noisy_healthy_job_keeps_its_waits_normal():
    ops = without_labels(simulate(NOISY).ops).reset_index(drop=True)
    fixed = rule_scores(ops, LocalizeConfig(gap_sigmas=0.0)) >= 0.5
    adaptive = rule_scores(ops, LocalizeConfig()) >= 0.5
    assert adaptive.sum() < 0.5 * fixed.sum()
    assert not (adaptive & ~fixed).any()  # the bar only ever rises


def test_a_straggler_on_the_noisy_job_keeps_its_abnormal_copies_and_is_named():
    res = simulate(replace(NOISY, faults=(FaultSpec.parse("gpu_slow:rank=9,severity=1.0"),)))
    ops = without_labels(res.ops).reset_index(drop=True)
    abnormal = res.ops["abnormal"].to_numpy(dtype=bool)
    fixed = rule_scores(ops, LocalizeConfig(gap_sigmas=0.0)) >= 0.5
    adaptive = rule_scores(ops, LocalizeConfig()) >= 0.5
    # the fault's copies the fixed bar caught are still caught; the noise's mostly are not
    assert adaptive[abnormal].sum() >= 0.8 * fixed[abnormal].sum()
    precision = [(f & abnormal).sum() / f.sum() for f in (fixed, adaptive)]
    assert precision[1] > 3 * precision[0]
    verdict = analyze(ops, res.topology, model="rule")
    assert verdict.candidates[0].ranks == (9,)
