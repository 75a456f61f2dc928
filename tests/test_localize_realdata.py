"""Real ByteDance what-if traces: a slowed worker is named; workload imbalance is not blamed."""

from __future__ import annotations

from pathlib import Path

import pytest

from holmes_ml.pipeline import analyze

DATA = Path("/work/shared/realdata/bytedance-whatif")
pytestmark = pytest.mark.skipif(not DATA.exists(), reason="real traces not available")


def _read(trial: str):
    io = pytest.importorskip("holmes_ml.io")
    if not hasattr(io, "read_ops"):
        pytest.skip("holmes_ml.io.read_ops not available")
    return io.read_ops(DATA / f"trace-{trial}.parquet", format="bytedance")


@pytest.mark.parametrize("model", [None, "rule"])
def test_ar_names_the_dp0_pp0_worker(model) -> None:
    verdict = analyze(_read("AR"), model=model)
    assert verdict.candidates
    top = verdict.candidates[0]
    assert top.coords is not None
    assert top.coords["dp"] == 0 and top.coords["pp"] == 0


@pytest.mark.parametrize("model", [None, "rule"])
@pytest.mark.parametrize("trial", ["SE", "ST"])
def test_workload_imbalance_is_not_blamed_on_a_device(trial: str, model) -> None:
    verdict = analyze(_read(trial), model=model)
    assert verdict.candidates == ()


@pytest.mark.parametrize("model", [None, "rule"])
def test_ar_names_nobody_beside_the_slowed_worker(model) -> None:
    # The data's README: name that worker "and nobody else". The other stages of dp 0's
    # pipeline wait for it, so both ends of their send/recv pairs communicate long: a delay
    # passed down the pipeline, not slow NICs. The last stages of the other replicas idle
    # (in no logged op) until dp 0 catches up and are let go at one instant: their partners'
    # waits for them are dp 0's delay too.
    verdict = analyze(_read("AR"), model=model)
    assert [c.ranks for c in verdict.candidates] == [(0,)]


@pytest.mark.parametrize("model", [None, "rule"])
def test_st_heavier_last_stage_is_reported_as_workload(model) -> None:
    # trace-ST's README: pipeline stage partitioning imbalance, the last stage heavier. Nothing
    # in it is abnormal against its own history (the stage is heavy from the first step); its
    # compute times per step say so.
    verdict = analyze(_read("ST"), model=model)
    (found,) = [w for w in verdict.workload_findings if w.kind == "stage-imbalance"]
    assert found.coords == {"pp": 3} and found.basis == "compute"
    assert verdict.candidates == ()


def test_se_and_ar_compute_times_name_no_stage_they_do_not_show() -> None:
    # SE: besides its rotating late rank (sequence lengths), its second (last) stage computes
    # about 1.5x the first on every one of its 32 ranks. AR: its slowed worker is one rank of
    # stage 0, and its last stage computes only ~5 % more than the others (below delta).
    se = analyze(_read("SE"), model="rule")
    assert [w.kind for w in se.workload_findings] == ["rank-imbalance", "stage-imbalance"]
    assert se.workload_findings[1].coords == {"pp": 1}
    ar = analyze(_read("AR"), model="rule")
    assert ar.workload_findings == ()


def test_without_compute_times_the_gaps_name_the_same_stages() -> None:
    # The same traces with step_compute_us dropped, as from a logger that records none: each
    # rank's time outside communication stands in. It holds more than compute in these traces
    # (the ratio it gives is larger), but the stages named are the same, and AR's one slowed
    # worker is still no heavier stage.
    def gaps(trial: str):
        return analyze(_read(trial).drop(columns="step_compute_us"), model="rule")

    st, se, ar = gaps("ST"), gaps("SE"), gaps("AR")
    assert st.candidates == () and se.candidates == ()
    assert [(w.coords, w.basis) for w in st.workload_findings] == [({"pp": 3}, "gaps")]
    assert [(w.kind, w.coords, w.basis) for w in se.workload_findings] == [
        ("rank-imbalance", None, "waits"), ("stage-imbalance", {"pp": 1}, "gaps")]
    assert ar.workload_findings == () and [c.ranks for c in ar.candidates] == [(0,)]
