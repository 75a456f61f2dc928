"""A healthy job gets no suspect: lateness far below the slowdown the user asked about is not a
device, even when the per-op detector flags operators and some iteration crosses delta."""

from __future__ import annotations

from dataclasses import replace

import pytest

from holmes_ml.io.schema import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate

#: A healthy MoE job whose compute drifts 20 % slower over 24 iterations, on a noisy cluster
#: (6 % jitter): its last iterations cross delta = 1.1 against the median of the earlier ones.
DRIFTING = SimConfig(gpus=128, model="mixtral-8x7b", tp=2, pp=2, ep=2, iterations=24,
                     seed=1012, jitter=0.06, drift=0.2)


@pytest.fixture(scope="module")
def drifting():
    res = simulate(DRIFTING)
    return without_labels(res.ops), res.topology


def test_drifting_healthy_job_names_no_device(drifting):
    ops, topo = drifting
    verdict = analyze(ops, topo)
    assert verdict.irregular_iterations  # the drift made some step delta-irregular
    assert verdict.candidates == ()
    # what the step floor holds back: without it, ranks late by jitter become suspects
    loose = analyze(ops, topo, config=LocalizeConfig(min_step_share=0.0))
    assert loose.candidates


def test_a_real_straggler_in_the_same_job_is_still_named():
    res = simulate(replace(DRIFTING, faults=(
        FaultSpec.parse("gpu_slow:rank=37,severity=0.3,start=12"),)))
    verdict = analyze(without_labels(res.ops), res.topology)
    assert verdict.candidates[0].ranks == (37,)


def test_min_step_share_is_checked():
    with pytest.raises(ValueError, match="min_step_share"):
        LocalizeConfig(min_step_share=1.5)
