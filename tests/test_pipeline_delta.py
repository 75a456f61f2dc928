"""The irregularity factor δ reaches the pipeline and the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from holmes_ml.cli import app
from holmes_ml.io import without_labels
from holmes_ml.localize import LocalizeConfig
from holmes_ml.pipeline import analyze
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


@pytest.fixture(scope="module")
def mild():
    # a straggler that makes iterations roughly 1.1-1.3x longer from iteration 5
    cfg = SimConfig(gpus=32, tp=2, pp=2, dp=8, iterations=14, seed=4,
                    faults=(FaultSpec.parse("gpu_slow:rank=9,severity=0.3,start=5"),))
    return simulate(cfg)


def test_higher_delta_flags_fewer_iterations(mild):
    ops = without_labels(mild.ops)
    low = analyze(ops, mild.topology, model="rule", config=LocalizeConfig(delta=1.02))
    high = analyze(ops, mild.topology, model="rule", config=LocalizeConfig(delta=3.0))
    assert set(high.irregular_iterations) < set(low.irregular_iterations)
    assert min(low.irregular_iterations) >= 5  # nothing before the onset


def test_bad_delta_is_refused_by_name():
    with pytest.raises(ValueError, match="delta"):
        LocalizeConfig(delta=0.9)


def test_cli_delta(mild, tmp_path):
    mild.write(tmp_path / "sim")
    out = CliRunner().invoke(app, ["localize", str(tmp_path / "sim"), "--model", "rule",
                                   "--json", "--delta", "3"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["irregular_iterations"] == []


def test_an_iteration_numbered_near_2_63_does_not_break_the_verdict(mild):
    """Iteration numbers are only identities: one stray number near 2**63 (a corrupt counter)
    next to 0..13 overflowed the packed keys; the straggler is still named."""
    ops = without_labels(mild.ops)
    want = analyze(ops, mild.topology)  # the bundled model
    it = ops["iteration"].to_numpy().copy()
    it[it == it.max()] = 2**63 - 1
    got = analyze(ops.assign(iteration=it), mild.topology)
    assert got.candidates and got.candidates[0].ranks == want.candidates[0].ranks == (9,)
