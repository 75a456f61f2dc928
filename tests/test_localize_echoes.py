"""A slow GPU in a deep pipeline: its replica's other stages and every replica's pipeline fill
relay the delay; those echoes must not dilute the origin (``rules._drop_echoes``).

512 GPUs, llama2-70b tp8 x pp8 (dp 8): one GPU computes 1.85x slower from step 2. Before the
echo rule the origin was still first but held 0.21-0.63 of the slowdown (the other 63 ranks of
its replica each looked late at the data-parallel collectives).
"""

from __future__ import annotations

import pytest

from holmes_ml.localize import DeviceKind
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


@pytest.mark.parametrize("seed", [3, 4])
def test_slow_gpu_in_a_deep_pipeline_keeps_most_of_the_blame(seed: int) -> None:
    res = simulate(SimConfig(gpus=512, model="llama2-70b", tp=8, pp=8, iterations=6, seed=seed,
                             faults=(FaultSpec.parse("gpu_slow:severity=0.85,start=2"),)))
    verdict = analyze(res.ops.drop(columns=["abnormal", "fault_id"]), res.topology)
    assert verdict.candidates, verdict
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.GPU
    assert top.ranks == tuple(res.faults[0].ranks)
    assert top.score >= 0.8, [(c.device, c.score) for c in verdict.candidates]
    # the relays (other ranks of the slowed replica) hold no sizeable share beside it
    assert all(c.score < 0.2 for c in verdict.candidates[1:])
