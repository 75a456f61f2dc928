"""Benchmarks: speed, memory and accuracy figures, written as JSON with the git commit.

Each benchmark is a function ``run(quick: bool) -> BenchResult`` in a module of this package,
registered in :data:`BENCHMARKS`; ``holmes bench NAME`` runs it and writes the result with
:func:`holmes_ml.bench.record.write_result`.
"""

#: name -> "module:function" (imported lazily so one missing extra does not break the others)
BENCHMARKS: dict[str, str] = {
    "simulator": "holmes_ml.bench.simulator:run",
    "features": "holmes_ml.bench.features:run",
    "detector": "holmes_ml.bench.detector:run",
    "drift": "holmes_ml.bench.drift:run",
    "localize": "holmes_ml.bench.localize:run",
    "latency": "holmes_ml.bench.latency:run",
    "agents": "holmes_ml.bench.agents:run",
    "follow": "holmes_ml.bench.follow:run",
    "logger": "holmes_ml.bench.logger:run",
    "serve": "holmes_ml.bench.serve:run",
}
