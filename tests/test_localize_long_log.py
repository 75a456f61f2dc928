"""Logs longer than the window: the verdict speaks of the steps the monitor flagged.

A long run whose slow episode is over still has a few abnormal operators in most later steps
(jitter the detector flags now and then). The analysed window used to be the 50 most recent
iterations with abnormal operators, so an episode older than that was reported as irregular
and then left out of the analysis. Now the window reaches back to the last irregular
iteration, the note names what was left out, and ``holmes localize --iterations A:B`` looks
at any stretch on its own.
"""

from __future__ import annotations

from functools import cache

import pytest
from typer.testing import CliRunner

from holmes_ml.cli import app
from holmes_ml.localize import DeviceKind
from holmes_ml.pipeline import analyze, only_iterations
from holmes_ml.simulator import FaultSpec, SimConfig, SimResult, simulate


@cache
def _job(seed: int, *faults: str) -> SimResult:
    return simulate(SimConfig(gpus=32, model="llama2-7b", iterations=120, seed=seed,
                              faults=tuple(FaultSpec.parse(f) for f in faults)))


@pytest.mark.parametrize("seed", [1, 4])
def test_an_episode_older_than_the_window_is_what_the_verdict_analyses(seed: int) -> None:
    res = _job(seed, "gpu_slow:rank=5,severity=0.5,start=20,end=40")
    v = analyze(res.ops, res.topology)
    assert set(v.irregular_iterations) >= set(range(21, 40))
    assert max(v.irregular_iterations) <= 45
    top = v.candidates[0]
    assert top.kind is DeviceKind.GPU and top.ranks == (5,)
    # named by the operator records of the episode, not by the comm-gap fallback
    assert all(e.rule != "comm-gap" and 20 <= e.iteration <= 45 for e in top.evidence)
    assert v.stats["analysed_last"] <= 45
    assert "the iterations after" in (v.note or "")


@pytest.mark.parametrize("seed", [1, 2])
def test_an_earlier_episode_left_out_is_named_and_can_be_localized_alone(seed: int) -> None:
    res = _job(seed, "gpu_slow:rank=5,severity=0.5,start=20,end=35",
               "gpu_slow:rank=9,severity=0.5,start=90,end=105")
    v = analyze(res.ops, res.topology)
    assert v.candidates[0].ranks == (9,)
    first = int(v.stats["analysed_first"])
    earlier = [i for i in v.irregular_iterations if i < first]
    assert earlier and min(earlier) <= 21
    # the range suggested reaches back a reference window: a slice starting at the episode
    # would hold nothing regular to measure it against (and call it regular)
    since = int(v.stats["left_out_from"])
    assert since == max(0, earlier[0] - 20)
    assert f"--iterations {since}:{earlier[-1]}" in (v.note or "")
    alone = analyze(only_iterations(res.ops, since, earlier[-1]), res.topology)
    assert alone.candidates[0].ranks == (5,)
    assert set(earlier) <= set(alone.irregular_iterations)


def test_only_iterations_keeps_both_ends_and_names_what_the_logs_hold() -> None:
    ops = _job(1, "gpu_slow:rank=5,severity=0.5,start=20,end=40").ops
    part = only_iterations(ops, 20, 40)
    assert (part["iteration"].min(), part["iteration"].max()) == (20, 40)
    assert only_iterations(ops, None, 3)["iteration"].max() == 3
    with pytest.raises(ValueError, match=r"--iterations 200:.*\(0-119\)"):
        only_iterations(ops, 200, None)


def test_localize_iterations_option(tmp_path) -> None:
    out = CliRunner().invoke(app, ["simulate", "--gpus", "32", "--model", "llama2-7b",
                                   "--iterations", "60", "--fault",
                                   "gpu_slow:rank=5,severity=0.5,start=10,end=20",
                                   "--out", str(tmp_path / "s"), "--no-progress"])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "s"), "--iterations", "30:",
                                   "--json"])
    assert out.exit_code == 0, out.output
    assert '"irregular_iterations": []' in out.stdout and '"ranks": [5]' not in out.stdout
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "s"), "--iterations", "5:25",
                                   "--json"])
    assert out.exit_code == 0, out.output
    assert '"ranks": [5]' in out.stdout
    for bad in ("25:5", "a:b", ":", "-3:4"):
        out = CliRunner().invoke(app, ["localize", str(tmp_path / "s"), "--iterations", bad])
        assert out.exit_code == 2
        assert out.stderr.strip().startswith(f"error: --iterations {bad}: expected A:B")
