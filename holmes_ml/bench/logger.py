"""Benchmark ``logger``: the cost :class:`holmes_ml.collect.CommOpsLogger` adds per operator.

Method. A 1-process gloo world all-reduces a 4-element tensor. Inside one logger context the same
call is timed through the logger's wrapper (``dist.all_reduce``) and through the original function
it wraps (``dist.all_reduce.__wrapped__``, i.e. the unlogged op), in many short blocks that
alternate ABAB/BABA so slow drifts of a shared machine hit both sides alike. The per-op overhead
is the median over block pairs of (logged - unlogged) block means (blocks of 10 ops: short enough
that most escape a preemption), plus the CPU time of the buffer flushes (the file writes) spread
over the rows they wrote, so the figure includes the amortized output cost that the median alone
would filter out, plus the garbage collector: the wall time of every collection that started
during a logged block minus that of collections during plain blocks, over the logged ops
(``gc_us_per_op``, never negative; collections inside a flush are already in its CPU time). The
median drops the rare blocks a collection lands in, so without this term a logger that allocates
per call would look cheaper than it is. The first flush (which opens the file and its writer, once
per job) is reported on its own as ``first_flush_ms``. Everything is written by the caller's
thread (the logger has no background thread), so the flush CPU time is all the output work.

``overhead_us_per_op = paired_diff_median_us + flush_us_per_op + gc_us_per_op``.

Noise is reported: the interquartile range of the paired differences and a seeded bootstrap 95%
interval of their median. ``hot_path_stub_us_per_op`` times the same wrapper around a no-op
function with ``all_reduce``'s signature: the logger's own per-call cost without gloo's jitter.
Goal: <= 2 us per op (the figure Holmes quotes).

The rows of that world barely vary (one op, one group, one size), which flatters a format whose
encodings thrive on repetition, so the file format is also timed on its own:
``sink_write_us_per_row`` and ``sink_bytes_per_row`` are the CPU time and bytes per row of writing
a seeded job-like mix (four op types over nine groups of 64 members, three message sizes, varied
starts and durations; 25 flushes of 8,192 rows) through the logger's sink in the benchmark's format.

``--log-format`` picks the format the logger writes (recorded in the config).

``--keep-cores-awake`` measures beside a lowest-priority spinning process (recorded in the config):
on an idle 2-core machine every gloo call hands work to a core that has gone to sleep, and its
wake-up slows the op (~60-90 us instead of ~20 us) and the wrapper code right after it alike,
which a training job's busy cores do not see.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from holmes_ml.bench.record import BenchResult
from holmes_ml.collect.torch_import import import_torch_distributed


def _block(fn: Callable[[Any], Any], tensor: Any, n: int) -> float:
    """Mean microseconds per call of ``fn(tensor)`` over ``n`` calls."""
    perf = time.perf_counter_ns
    t0 = perf()
    for _ in range(n):
        fn(tensor)
    return (perf() - t0) / 1000.0 / n


class _GcClock:
    """Wall time of garbage-collector passes, split by what was running when they started.

    The median of block differences drops the rare blocks a collection lands in, so the passes
    a logger's allocations trigger would go uncharged; this clock adds them back.
    """

    def __init__(self) -> None:
        self.phase = "setup"
        self.ns: dict[str, int] = {}
        self.passes: dict[str, int] = {}
        self._t0 = 0

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "start":
            self._t0 = time.perf_counter_ns()
        else:
            self.ns[self.phase] = self.ns.get(self.phase, 0) + time.perf_counter_ns() - self._t0
            self.passes[self.phase] = self.passes.get(self.phase, 0) + 1


def _paired(plain: Callable, logged: Callable, tensor: Any, pairs: int, block: int,
            gc_clock: _GcClock | None = None) -> tuple[list[float], list[float]]:
    a: list[float] = []
    b: list[float] = []
    clock = gc_clock or _GcClock()
    for i in range(pairs):
        if i % 2:
            clock.phase = "logged"
            b.append(_block(logged, tensor, block))
            clock.phase = "plain"
            a.append(_block(plain, tensor, block))
        else:
            clock.phase = "plain"
            a.append(_block(plain, tensor, block))
            clock.phase = "logged"
            b.append(_block(logged, tensor, block))
    clock.phase = "setup"
    return a, b


def _bootstrap_median_ci(diff: np.ndarray, seed: int = 0, n_boot: int = 2000
                         ) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(n_boot, len(diff)))
    meds = np.median(diff[idx], axis=1)
    return float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def _spinner() -> Any:
    """A lowest-priority process spinning on a core (see ``keep_cores_awake``)."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"])


def run(quick: bool = False, keep_cores_awake: bool = False, fmt: str | None = None
        ) -> BenchResult:
    """Measure the added µs per logged op (see the module docstring for the method), the
    logger writing its file as ``fmt`` (``"arrow"``, ``"parquet"`` or ``"jsonl"``; by default
    the format a user gets).

    ``keep_cores_awake`` runs a lowest-priority spinning process during the measurement, as the
    busy cores of a training job would be: on an idle machine each gloo call wakes a sleeping
    core, which slows the op and the code right after it alike.
    """
    from holmes_ml.collect import LoggerConfig

    fmt = fmt or LoggerConfig().fmt
    spinner = _spinner() if keep_cores_awake else None
    try:
        result = _run(quick, keep_cores_awake, fmt)
        result.figures.update(_sink_cost(fmt))
        return result
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def _sink_cost(fmt: str, flushes: int = 25, rows: int = 8192) -> dict[str, float]:
    """CPU time and bytes per row of writing a seeded, job-like mix of rows as ``fmt``."""
    from holmes_ml.collect.writer import Coded, RowSink

    rng = np.random.default_rng(0)
    groups = [f"{kind}-{i}" for kind, k in (("tp", 4), ("dp", 4), ("pp", 1)) for i in range(k)]
    members = [" ".join(map(str, range(i, i + 64))) for i in range(len(groups))]
    kinds = [name.split("-")[0] for name in groups]
    ops = ["all_reduce", "all_gather", "send", "recv"]
    batches: list[dict[str, Any]] = []
    for b in range(flushes):
        g = rng.integers(0, len(groups), rows)
        zero = np.zeros(rows, dtype=np.int64)
        batches.append({
            "iteration": np.full(rows, b), "rank": np.full(rows, 3),
            "op": Coded(rng.integers(0, len(ops), rows), ops), "group": Coded(g, groups),
            "seq": np.arange(rows) + b * rows, "nbytes": rng.choice([4096, 1 << 20, 1 << 24], rows),
            "start_ns": 10**18 + b * 10**10 + np.cumsum(rng.integers(1000, 100_000, rows)),
            "duration_us": rng.gamma(2.0, 50.0, rows), "group_ranks": Coded(g, members),
            "group_kind": Coded(g, kinds), "peer": np.full(rows, -1),
            "host": Coded(zero, ["node0003"]), "job": Coded(zero, ["bench"])})
    with tempfile.TemporaryDirectory(prefix="holmes-bench-sink-") as tmp:
        # a process's first write in a format loads and sets up its code (0.3-0.6 s here):
        # a one-time cost, like first_flush_ms, not one per row
        warm = RowSink(os.path.join(tmp, "warm-up"), fmt)
        warm.write(batches[0])
        warm.close()
        sink = RowSink(os.path.join(tmp, "rank3"), fmt)
        t0 = time.process_time_ns()
        for batch in batches:
            sink.write(batch)
        sink.close()
        cpu_ns = time.process_time_ns() - t0
        size = sink.path.stat().st_size
    n = flushes * rows
    return {"sink_write_us_per_row": round(cpu_ns / 1000.0 / n, 3),
            "sink_bytes_per_row": round(size / n, 2)}


def _run(quick: bool, keep_cores_awake: bool, fmt: str) -> BenchResult:
    dist = import_torch_distributed()
    import torch

    from holmes_ml.bench.record import peak_rss_mb  # noqa: I001 - keep torch import first
    from holmes_ml.collect import CommOpsLogger, LoggerConfig
    from holmes_ml.collect.logger import _SPECS

    pairs, block = (3000, 10) if quick else (20000, 10)
    flush_every = LoggerConfig().flush_every  # the default a user gets
    tmp = tempfile.mkdtemp(prefix="holmes-bench-logger-")
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    tensor = torch.zeros(4)
    flush_ns: list[int] = []
    try:
        with CommOpsLogger(LoggerConfig(out_dir=tmp, timing="wall", fmt=fmt)) as log:
            logged_fn = dist.all_reduce
            plain_fn = logged_fn.__wrapped__  # the very function the logger calls
            real_flush = log.flush

            gc_clock = _GcClock()

            def timed_flush(final: bool = False) -> int:
                # CPU time of the process (all threads), not wall time: one flush is a few ms
                # of deterministic work that a preemption on a shared machine would multiply.
                # Collections inside a flush are in this CPU time, so the GC clock skips them.
                phase, gc_clock.phase = gc_clock.phase, "flush"
                t0 = time.process_time_ns()
                out = real_flush(final)
                flush_ns.append(time.process_time_ns() - t0)
                gc_clock.phase = phase
                return out

            log.flush = timed_flush  # type: ignore[method-assign]
            for fn in (plain_fn, logged_fn):  # warm up both paths (caches, first-use groups)
                _block(fn, tensor, 1000)
            log.flush()  # the first flush opens the file's writer: a one-time cost, apart
            setup_flush_ns = flush_ns.pop()
            gc.callbacks.append(gc_clock)
            try:
                plain, logged = _paired(plain_fn, logged_fn, tensor, pairs, block, gc_clock)
            finally:
                gc.callbacks.remove(gc_clock)
            log.flush()  # the real rows go out (timed) before the stub measurement below
            rows_written = (log._sink.rows_written if log._sink else 0) - 1000
            real_flush_ns = list(flush_ns)  # stub rows below also trigger flushes: not counted

            def stub(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False
                     ) -> None:
                return None

            # the logger's own cost around a no-op with all_reduce's signature (private hook of
            # the logger: the same wrapper factory __enter__ uses)
            wrapped_stub = log._make_wrapper(stub, *_SPECS["all_reduce"])
            stub_plain, stub_logged = _paired(stub, wrapped_stub, tensor, 200, 500)
            log._fill[0] = 0  # stub rows are not part of the file
    finally:
        if created:
            dist.destroy_process_group()
    diff = np.asarray(logged) - np.asarray(plain)
    med = float(np.median(diff))
    q1, q3 = (float(x) for x in np.quantile(diff, [0.25, 0.75]))
    lo, hi = _bootstrap_median_ci(diff)
    flush_us_per_op = sum(real_flush_ns) / 1000.0 / max(rows_written, 1)
    # collections that started during logged blocks beyond those during as many plain blocks,
    # over the logged ops; never negative (a logger is not credited for the plain side's GC)
    logged_ops = pairs * block
    gc_us_per_op = max(0.0, (gc_clock.ns.get("logged", 0) - gc_clock.ns.get("plain", 0))
                       / 1000.0 / logged_ops)
    charged = flush_us_per_op + gc_us_per_op
    stub_diff = float(np.median(np.asarray(stub_logged) - np.asarray(stub_plain)))
    return BenchResult(
        name="logger",
        figures={
            "overhead_us_per_op": round(med + charged, 3),
            "overhead_ci95_low_us": round(lo + charged, 3),
            "overhead_ci95_high_us": round(hi + charged, 3),
            "paired_diff_iqr_us": round(q3 - q1, 3),
            "paired_diff_median_us": round(med, 3),
            "flush_us_per_op": round(flush_us_per_op, 3),
            "gc_us_per_op": round(gc_us_per_op, 3),
            "gc_passes_logged": gc_clock.passes.get("logged", 0),
            "gc_passes_plain": gc_clock.passes.get("plain", 0),
            "gc_passes_in_flush": gc_clock.passes.get("flush", 0),
            "first_flush_ms": round(setup_flush_ns / 1e6, 1),
            "hot_path_stub_us_per_op": round(stub_diff, 3),
            "unlogged_us_per_op": round(statistics.median(plain), 3),
            "logged_us_per_op": round(statistics.median(logged), 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        },
        config={"keep_cores_awake": keep_cores_awake, "block_pairs": pairs, "ops_per_block": block, "quick": quick,
                "flush_every": flush_every, "rows_logged": rows_written, "world_size": 1,
                "fmt": fmt,
                "backend": "gloo", "tensor_elems": 4, "torch": torch.__version__,
                "method": "median of paired ABAB/BABA block differences + flush CPU time per "
                          "row + GC pause time of logged minus plain blocks per op; bootstrap "
                          "95% CI (seed 0) of the median, shifted by the charged terms"},
        goals={"overhead_us_per_op": "<= 2"},
        details={"plain_us": plain, "logged_us": logged,
                 "flush_ms": [x / 1e6 for x in real_flush_ns]},
    )
