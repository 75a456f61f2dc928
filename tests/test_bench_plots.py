"""The localization benchmark draws its comparison plots and names them in the result."""

from __future__ import annotations

from holmes_ml.bench import BENCHMARKS
from holmes_ml.bench.localize import _plots
from holmes_ml.bench.plugins import load_localizer, suspect_ranks


def test_plots_written_for_methods_and_breakdown(tmp_path):
    summary = [
        {"method": "holmes", "trials": 10, "top1": 0.9, "top1_ci95": "[0.60, 0.98]"},
        {"method": "longest comm", "trials": 10, "top1": 0.1, "top1_ci95": "[0.02, 0.40]"},
    ]
    breakdown = [
        {"by": "gpus", "value": str(g), "method": m, "trials": 5, "top1": t, "top2": t}
        for g in (64, 128) for m, t in (("holmes", 0.9), ("longest comm", 0.1))
    ]
    files = _plots(summary, breakdown, tmp_path)
    assert files == ["localize-methods.png", "localize-breakdown.png"]
    for f in files:
        assert (tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_benchmark_is_importable():
    import importlib

    for name, target in BENCHMARKS.items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_plugin_loader_errors_name_the_spec():
    import pytest

    with pytest.raises(ValueError, match="nope:thing"):
        load_localizer("nope:thing")
    with pytest.raises(ValueError, match="module:attribute"):
        load_localizer("just-a-name")
    assert suspect_ranks(5, topology=None) == frozenset({5})

    import numpy as np

    assert suspect_ranks(np.int64(7), topology=None) == frozenset({7})
    with pytest.raises(TypeError, match="of type bool"):
        suspect_ranks(np.bool_(True), topology=None)


def test_plugin_loader_refuses_a_callable_that_cannot_take_ops_and_topology():
    import pytest

    with pytest.raises(ValueError, match=r"cannot be called as \(ops, topology\)"):
        load_localizer("holmes_ml.topology:device_kind")  # takes one argument
    assert load_localizer("holmes_ml.bench.plugins:example_longest_comm")
