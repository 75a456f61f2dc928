"""``holmes bench localize``: localization accuracy beside the baselines, speed and bytes shipped.

Accuracy: seeded simulator jobs with one injected fault each plus healthy jobs (:func:`scenarios`):
scales x fault kinds x patterns (3-D layout), parallel layouts 2-D ... 6-D (6-D = tp, pp, dp, ep,
cp plus HSDP's replica groups) at 128 GPUs, a sweep over the irregularity factor delta (the
localizer runs with ``LocalizeConfig(delta=d)`` on faults sized to just exceed ``d``), and in the
full run 2,048- and 8,192-GPU jobs (llama2-70b, tp8 x pp8; 4 seeds x 5 fault kinds each). The
fault kinds are :data:`SEVERITY`'s: a slow GPU, a slow NIC, a host stall, a slow leaf-spine link
and a congested (leaf) switch. Each
fault-free twin (same job, same seed) is simulated once and shared by its trials; the full run
spreads the twins over processes. Beside the grid: a sweep of healthy jobs over every layout on
noisy, drifting clusters (:func:`healthy_sweep`: how often a healthy job gets a suspect) and a
sweep of faulty jobs drawn the same way (:func:`noisy_sweep`), scored apart from the grid
(``noisy_*`` columns, table "faulty jobs on noisy clusters").
A method is right at top-k when one of its first k suspects names a rank of the injected fault
(a device id counts as the ranks under it; a slow link's or switch's ranks are those under it
whose traffic crosses it: :func:`~holmes_ml.bench.plugins.fault_ranks`, so a GPU on another leaf
whose ring crosses the link does not name it) and stands for no more ranks than the faulty device
(:func:`~holmes_ml.bench.plugins.fault_breadth`: a spine switch above everyone names no fault
but a spine's, a host no slow GPU of its own) — Holmes itself is also scored on the exact device id
(``device_top1``; ``device_top1_ties`` also accepts any network device crossed by exactly the
same flows as the faulty one, e.g. a NIC and the leaf-spine link only its flows cross). Intervals are
Wilson 95 % over the trials. ``top1_ties`` (all methods alike) also counts a first suspect on a
network device that carries exactly the same flows as the faulty one: such devices slow the same
operators by the same amount, so durations cannot separate them (the NICs of one data-parallel
ring in a 2-D job, two leaf-spine links carrying one pipeline pair); the strict ``top1`` stays
the headline. Holmes' misses are listed in ``details``, every
trial of every method in ``localize-trials.csv.gz`` beside the report, and a method's failures
(a plug-in that raised or returned a suspect of no known type, or of none of the job's ranks or
devices) in the ``errors`` column: over every job it ran on, healthy and noisy ones too, where
``trials`` counts the faulty grid jobs only; a failure scores as a miss on a faulty job and as an
alarm on a healthy one (no healthy answer was given).
``holmes, per node`` is Holmes as it is deployed (``holmes agent`` on every host, ``holmes
serve`` in the middle): each host's operators are scored on their own
(:func:`~holmes_ml.pipeline.summarize_per_host`), without the copies the other hosts logged,
and the verdict comes from the merged summaries.

Speed: one 8,192-GPU window (quick: 2,048 GPUs), ``localize_summaries`` on the shipped summary,
versus the same rules over every operator copy (no detector pre-filter); and the deployed path:
each host's summary with the bundled model timed on its own (median and slowest host), then the
verdict from those summaries (``window_seconds_deployed`` = slowest host + verdict). Bytes: the
Parquet size of the summary versus the raw operator log.
"""

from __future__ import annotations

import gc
import io
import json
import logging
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml.bench.record import BenchResult
from holmes_ml.io.schema import without_labels

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ baselines
def longest_comm(ops: pd.DataFrame, topology: Any = None) -> list[int]:
    """Rank with the longest total communication time first."""
    return [int(r) for r in ops.groupby("rank")["duration_us"].sum().sort_values(
        ascending=False).index[:5]]


def shortest_comm(ops: pd.DataFrame, topology: Any = None) -> list[int]:
    """Rank with the shortest total communication time first (the one others wait for)."""
    return [int(r) for r in ops.groupby("rank")["duration_us"].sum().sort_values().index[:5]]


def nvrx_relative(ops: pd.DataFrame, topology: Any = None) -> list[int]:
    """NVRx-style relative score: each rank's compute time (iteration span minus communication)
    over the median rank's; highest first."""
    end = ops["start_ns"] + (ops["duration_us"] * 1e3).astype(np.int64)
    per = ops.assign(end=end).groupby(["iteration", "rank"]).agg(
        s=("start_ns", "min"), e=("end", "max"), c=("duration_us", "sum"))
    compute = ((per["e"] - per["s"]) / 1e3 - per["c"]).groupby(level="rank").sum()
    score = compute / compute.median()
    return [int(r) for r in score.sort_values(ascending=False).index[:5]]


def hta_late_start(ops: pd.DataFrame, topology: Any = None) -> list[int]:
    """HTA's heuristic: the rank most often the last to start a collective."""
    coll = ops[ops["peer"] < 0] if "peer" in ops.columns else ops
    idx = coll.groupby(["iteration", coll["group"].astype(str), "seq"])["start_ns"].idxmax()
    counts = coll.loc[idx, "rank"].value_counts()
    return [int(r) for r in counts.index[:5]]


# ------------------------------------------------------------------ scenarios
#: Iterations per simulated trial, and the irregularity factor a fault must reach to count.
ITERATIONS = 10
DELTA = 1.1
#: The delta sweep: LocalizeConfig(delta=d) with the fault sized so the peak iteration-time ratio
#: against the fault-free twin lands just above d (the hardest observable case for that d).
DELTAS: tuple[float, ...] = (1.05, 1.1, 1.2, 1.5)
DELTA_HEADROOM = 1.3
#: Jobs at 2,048 GPUs and more: llama2-70b, tp8 x pp8, fewer iterations; faults sized to this ratio.
BIG_LAYOUT: dict[str, Any] = {"model": "llama2-70b", "tp": 8, "pp": 8}
BIG_ITERATIONS = 6
BIG_TARGET = 1.3
LAYOUTS: dict[str, dict[str, Any]] = {
    "2-D (tp,dp)": {"tp": 2, "pp": 1},
    "3-D (tp,pp,dp)": {"tp": 2, "pp": 2},
    "4-D (+ep)": {"tp": 2, "pp": 2, "ep": 2, "model": "mixtral-8x7b"},
    "5-D (+cp)": {"tp": 2, "pp": 2, "ep": 2, "cp": 2, "model": "mixtral-8x7b"},
    "6-D (+hsdp)": {"tp": 2, "pp": 2, "ep": 2, "cp": 2, "dp_replicate": 2,
                    "model": "mixtral-8x7b"},
}
#: Healthy jobs beyond the grid's 3-D ones (:func:`healthy_sweep`): every layout, noisier
#: clusters (log-normal sigma of every compute and transfer time) and jobs that slow down as
#: they run (compute and transfer drift over the job), to measure how often a healthy job gets
#: a suspect. Full run / ``quick``.
HEALTHY_SWEEP: tuple[int, int] = (300, 20)
HEALTHY_GPUS: tuple[int, ...] = (64, 128, 256)
HEALTHY_ITERATIONS: tuple[int, ...] = (10, 16, 24)
HEALTHY_JITTER: tuple[float, ...] = (0.01, 0.03, 0.06, 0.1)
HEALTHY_DRIFT: tuple[float, ...] = (0.0, 0.1, 0.2)
HEALTHY_COMM_DRIFT: tuple[float, ...] = (0.0, 0.2)
#: Faulty jobs on the same noisy, drifting clusters as the healthy sweep (:func:`noisy_sweep`),
#: full run / ``quick``; each fault is sized so its peak iteration-time ratio against the
#: fault-free twin reaches one of :data:`NOISY_TARGETS`.
NOISY_SWEEP: tuple[int, int] = (200, 12)
NOISY_TARGETS: tuple[float, ...] = (1.2, 1.3, 1.5)
#: Simulator knobs a scenario may set beside its layout.
_SIM_KNOBS: tuple[str, ...] = ("jitter", "drift", "comm_drift")
#: Default severity of each fault kind of the grid (gpu/host: x1.5 compute / pause of half an
#: iteration; nic/link/switch: bandwidth / 3).
SEVERITY: dict[str, float] = {"gpu_slow": 0.5, "nic_slow": 2.0, "host_stall": 0.5,
                              "link_slow": 2.0, "switch_congested": 2.0}
#: Fault kinds the noisy sweep draws from (its draws predate switch faults in the grid; a kind
#: added here would change every job drawn after the first that picks it).
NOISY_KINDS: tuple[str, ...] = ("gpu_slow", "nic_slow", "host_stall", "link_slow")


#: Simulator seeds of the grid's jobs: (full run, ``--quick``).
GRID_SEEDS: tuple[tuple[int, ...], tuple[int, ...]] = ((11, 12, 13, 14, 15), (11, 12))
#: The sweeps' (seed of the draw of their jobs' knobs, first job's simulator seed).
HEALTHY_DRAW: tuple[int, int] = (2026, 2000)
NOISY_DRAW: tuple[int, int] = (2027, 3000)


def _sc(gpus: int, dims: str, kind: str, pattern: str, seed: int, **kw: Any) -> dict[str, Any]:
    sc: dict[str, Any] = {"gpus": gpus, "dims": dims, "delta": DELTA, "kind": kind,
                          "pattern": pattern, "seed": seed, "layout": LAYOUTS[dims],
                          "iterations": ITERATIONS, "target": None}
    sc.update(kw)
    if kind == "healthy":
        sc["fault"] = None
    elif "fault" not in sc:
        sc["fault"] = f"{kind}:severity={SEVERITY[kind]},pattern={pattern},start=2"
    return sc


def scenarios(quick: bool) -> list[dict[str, Any]]:
    """The seeded trial grid (see the module docstring); one dict per simulated job.

    Keys: ``gpus, dims, delta, kind, pattern, seed, layout, iterations, fault`` (a
    :meth:`FaultSpec.parse` string or None for a healthy job) and ``target`` (None, or the peak
    iteration-time ratio against the fault-free twin the fault's severity is scaled to reach).
    """
    seeds = list(GRID_SEEDS[1] if quick else GRID_SEEDS[0])
    kinds = list(SEVERITY)
    out: list[dict[str, Any]] = []
    scales = [64, 128, 256] if quick else [64, 128, 256, 512, 1024]
    base = "3-D (tp,pp,dp)"
    for gpus in scales:
        for kind in kinds:
            for pattern in ("persistent", "spike", "fluctuation"):
                if quick and pattern != "persistent" and gpus != 128:
                    continue
                for seed in seeds if gpus <= 256 else seeds[:3]:
                    out.append(_sc(gpus, base, kind, pattern, seed))
    # Parallel layouts at 128 GPUs (the 3-D point is the scale grid's 128).
    for dims in LAYOUTS:
        if dims == base:
            continue
        for kind in ("gpu_slow", "nic_slow", "host_stall"):
            if quick and kind != "gpu_slow" and not dims.startswith("6-D"):
                continue
            for seed in seeds:
                out.append(_sc(128, dims, kind, "persistent", seed))
    if not quick:
        for kind in ("gpu_slow", "nic_slow", "host_stall"):
            for seed in seeds[:2]:
                out.append(_sc(1024, "6-D (+hsdp)", kind, "persistent", seed))
    # Delta sweep at 128 GPUs, 3-D.
    for delta in DELTAS:
        for kind in ("gpu_slow", "nic_slow") if quick else ("gpu_slow", "nic_slow", "host_stall"):
            for seed in seeds:
                out.append(_sc(128, base, kind, "persistent", seed, delta=delta, sweep="delta",
                               target=round(1 + (delta - 1) * DELTA_HEADROOM, 4)))
    # Large jobs: llama2-70b tp8 pp8, faults sized to a BIG_TARGET peak ratio.
    if not quick:
        for gpus, big_seeds in ((2048, seeds[:4]), (8192, seeds[:4])):
            for kind in kinds:
                for seed in big_seeds:
                    out.append(_sc(gpus, base, kind, "persistent", seed, layout=BIG_LAYOUT,
                                   iterations=BIG_ITERATIONS, target=BIG_TARGET))
            out.append(_sc(gpus, base, "healthy", "", big_seeds[0], layout=BIG_LAYOUT,
                           iterations=BIG_ITERATIONS))
    for gpus in scales:
        for seed in seeds:
            out.append(_sc(gpus, base, "healthy", "", seed))
    return out + healthy_sweep(quick) + noisy_sweep(quick)


def _draw_job(rng: np.random.Generator, i: int) -> tuple[str, int, int]:
    """Layout (cycling through :data:`LAYOUTS`), GPUs and iterations of a sweep's ``i``-th job."""
    dims = list(LAYOUTS)[i % len(LAYOUTS)]
    gpus = int(rng.choice(HEALTHY_GPUS))
    if "ep" in LAYOUTS[dims]:  # the MoE layouts need 128 GPUs or more
        gpus = max(gpus, 128)
    return dims, gpus, int(rng.choice(HEALTHY_ITERATIONS))


def _draw_noise(rng: np.random.Generator) -> dict[str, float]:
    """Jitter, compute drift and transfer drift of a sweep's job."""
    return {"jitter": float(rng.choice(HEALTHY_JITTER)),
            "drift": float(rng.choice(HEALTHY_DRIFT)),
            "comm_drift": float(rng.choice(HEALTHY_COMM_DRIFT))}


def noisy_sweep(quick: bool, draw: int = NOISY_DRAW[0], first_seed: int = NOISY_DRAW[1],
                n: int | None = None, kinds: tuple[str, ...] = NOISY_KINDS
                ) -> list[dict[str, Any]]:
    """Seeded faulty jobs drawn like :func:`healthy_sweep` (every layout, 64-256 GPUs, 10-24
    iterations, jitter, compute and transfer drift), each with one fault: one of ``kinds``
    (default :data:`NOISY_KINDS`; any of :data:`SEVERITY`), a pattern, a start in the first
    half of the run, and a severity scaled so the peak iteration-time ratio against the
    fault-free twin reaches a target of :data:`NOISY_TARGETS`. The grid's faults all run at the simulator's default 3 % jitter
    without drift; these measure accuracy where the healthy sweep measures false alarms."""
    unknown = sorted(set(kinds) - set(SEVERITY))
    if unknown or not kinds:
        raise ValueError(f"kinds: {unknown[0] if unknown else 'none'!r}; expected some of "
                         f"{sorted(SEVERITY)}")
    rng = np.random.default_rng(draw)
    out = []
    if n is None:
        n = NOISY_SWEEP[1] if quick else NOISY_SWEEP[0]
    for i in range(n):
        dims, gpus, iterations = _draw_job(rng, i)
        kind = kinds[int(rng.integers(len(kinds)))]
        pattern = str(rng.choice(["persistent", "spike", "fluctuation"]))
        start = int(rng.integers(2, iterations // 2 + 1))
        out.append(_sc(gpus, dims, kind, pattern, first_seed + i, sweep="noisy",
                       iterations=iterations,
                       fault=f"{kind}:severity={SEVERITY[kind]},pattern={pattern},start={start}",
                       target=float(rng.choice(NOISY_TARGETS)), **_draw_noise(rng)))
    return out


def healthy_sweep(quick: bool, draw: int = HEALTHY_DRAW[0], first_seed: int = HEALTHY_DRAW[1],
                  n: int | None = None) -> list[dict[str, Any]]:
    """Seeded healthy jobs over every layout, 64-256 GPUs (128+ for the MoE layouts), 10-24
    iterations, each with a jitter, compute drift and transfer drift drawn from
    :data:`HEALTHY_JITTER`, :data:`HEALTHY_DRIFT` and :data:`HEALTHY_COMM_DRIFT`.

    ``draw`` seeds the draw of the knobs, ``first_seed`` is the first job's simulator seed and
    ``n`` the number of jobs (default :data:`HEALTHY_SWEEP`): other values give fresh jobs of
    the same kind, on which no constant was chosen (``scripts/healthy_holdout.py``)."""
    rng = np.random.default_rng(draw)
    out = []
    if n is None:
        n = HEALTHY_SWEEP[1] if quick else HEALTHY_SWEEP[0]
    for i in range(n):
        dims, gpus, iterations = _draw_job(rng, i)
        out.append(_sc(gpus, dims, "healthy", "", first_seed + i, sweep="healthy",
                       iterations=iterations, **_draw_noise(rng)))
    return out


def _ci(k: int, n: int) -> str:
    lo, hi = _wilson(k, n)
    return f"[{lo:.3f}, {hi:.3f}]"


def _healthy_table(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Share of healthy jobs given a suspect, for the methods that can say "healthy": over all
    healthy jobs, then over the sweep (:func:`healthy_sweep`) by jitter, drift and layout."""
    if trials.empty or "flagged" not in trials.columns:
        return []
    declining = [name for name, fn in _methods(None).items() if isinstance(fn, str)]
    healthy = trials[(trials["kind"] == "healthy") & trials["method"].isin(declining)]
    sweep = healthy[healthy["sweep"] == "healthy"] if "sweep" in healthy.columns else healthy[:0]
    parts: list[tuple[str, str, pd.DataFrame]] = [("all healthy jobs", "", healthy)]
    for key in ("jitter", "drift", "comm_drift", "dims"):
        if key in sweep.columns:
            parts += [(f"sweep, {key}", str(v), sub) for v, sub in sweep.groupby(key)]
    rows = []
    for by, value, part in parts:
        for name, sub in part.groupby("method", sort=False):
            k, n = int(sub["flagged"].sum()), len(sub)
            rows.append({"jobs": by, "value": value, "method": name, "n": n, "flagged": k,
                         "share": round(k / n, 3) if n else None, "share_ci95": _ci(k, n)})
    return rows


def _wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    z = 1.96
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _suspect_ranks(s: Any, topology: Any) -> set[int]:
    from holmes_ml.bench.plugins import suspect_ranks

    return set(suspect_ranks(s, topology))


def _names(s: Any, truth: set[int], topology: Any, widest: int | None = None) -> bool:
    from holmes_ml.bench.plugins import names_fault

    return names_fault(s, truth, topology, widest)


def _hit(suspects: list[Any], truth: set[int], k: int, topology: Any = None,
         widest: int | None = None) -> bool:
    return any(_names(s, truth, topology, widest) for s in suspects[:k])


def _top1_split(suspects: list[Any], truth: set[int], topology: Any = None,
                widest: int | None = None) -> float:
    """Top-1 credit when the method's own declared ties at the top are broken at random.

    A verdict that names its first candidate ``tied_with`` other devices (same evidence, same
    score) says it cannot order them; picking one at random would hit the truth with
    probability (tied candidates naming it) / (size of the tie). Methods that declare no ties
    score as strict top-1.
    """
    from holmes_ml.bench.plugins import suspect_device

    if not suspects:
        return 0.0
    top = suspects[0]
    own = suspect_device(top)
    # each other device once: a tie padded with repeats (or naming itself) earns no more
    tied = list(dict.fromkeys(d for d in (getattr(top, "tied_with", ()) or ()) if d != own))
    listed = {suspect_device(s): s for s in suspects[1:]}
    # A GPU is tied with its host (two readings of one rank's lateness): both name that rank.
    # A tied network device the verdict did not list (beyond top_k) names no one.
    same = top if getattr(getattr(top, "kind", None), "value", None) == "gpu" else None
    group = [top] + [listed.get(d, same) for d in tied]
    hits = sum(s is not None and _names(s, truth, topology, widest) for s in group)
    return hits / len(group)


def _flows_by_device(ops: pd.DataFrame, topology: Any) -> dict[str, frozenset[str]]:
    """Per network device, the job's flows crossing it (communicator rings and send/recv
    pairs, from ``group_ranks``); empty without that column."""
    from holmes_ml.localize.fabric import Fabric

    if "group_ranks" not in ops.columns:
        return {}
    # the distinct lists first: a member list of every rank is 40 kB on each row of its group
    return Fabric(topology).flows_by_device([str(v) for v in pd.unique(ops["group_ranks"])])


def _alike(flows_of: dict[str, frozenset[str]], devices: set[str]) -> set[str]:
    """Every network device crossed by exactly the same flows as one of ``devices`` (those
    included). Such devices slow exactly the same operators when they fail, so no method that
    reads operator durations can tell them apart (e.g. the NICs of one data-parallel ring in a
    2-D job, the two ends of a pipeline pair with no other inter-host traffic, or a NIC and the
    leaf-spine link that only its flows cross)."""
    out: set[str] = set()
    for dev in devices:
        sig = flows_of.get(dev)
        if sig:
            out.update(d for d, flows in flows_of.items() if flows == sig)
    return out


def _methods(localizers: dict[str, Any] | None) -> dict[str, Any]:
    methods: dict[str, Any] = {
        "holmes": "holmes",
        "holmes, per node": "holmes-nodes",
        "3sigma+rule (no ML)": "rule",
        "longest comm": longest_comm,
        "shortest comm": shortest_comm,
        "NVRx relative": nvrx_relative,
        "HTA late start": hta_late_start,
    }
    taken = sorted(set(localizers or {}) & set(methods))
    if taken:
        raise ValueError(f"localizer name {taken[0]!r} is a built-in method's; expected "
                         "another name for a plug-in (its figures would replace the built-in's)")
    methods.update(localizers or {})
    return methods


def _sim_config(sc: dict[str, Any], faults: tuple = ()) -> Any:
    from holmes_ml.simulator import SimConfig

    lay = dict(sc["layout"])
    model = lay.pop("model", "llama2-7b")
    knobs = {k: sc[k] for k in _SIM_KNOBS if k in sc}
    return SimConfig(gpus=sc["gpus"], model=model, iterations=sc["iterations"], seed=sc["seed"],
                     faults=faults, **lay, **knobs)


def _twin_key(sc: dict[str, Any]) -> tuple:
    return (sc["gpus"], sc["seed"], sc["iterations"], tuple(sorted(sc["layout"].items())),
            tuple(sc.get(k) for k in _SIM_KNOBS))


def _peak_ratio(res: Any, twin_durations: pd.Series) -> float:
    from holmes_ml.features import iteration_table

    ratio = iteration_table(res.ops)["duration_s"] / twin_durations
    return float(ratio.max())


def _simulate_scenario(sc: dict[str, Any], twin: pd.Series) -> tuple[Any, float, float]:
    """Simulate ``sc``; with a ``target``, rescale the severity once (secant through the
    fault-free point, where the ratio is 1) so the peak ratio lands near the target.

    Returns the result, the severity used and the peak iteration-time ratio against the twin.
    """
    from holmes_ml.simulator import FaultSpec, simulate

    spec = FaultSpec.parse(sc["fault"])
    res = simulate(_sim_config(sc, (spec,)))
    peak = _peak_ratio(res, twin)
    target = sc.get("target")
    # Up to two corrections: the ratio is only roughly linear in the severity.
    for _ in range(2):
        close = abs(peak - target) <= 0.25 * (target - 1) if target else True
        if not target or peak <= 1.002 or (close and peak >= sc["delta"]):
            break
        severity = float(np.clip(spec.severity * (target - 1) / (peak - 1), 0.02, 50.0))
        spec = replace(spec, severity=severity)
        res = simulate(_sim_config(sc, (spec,)))
        peak = _peak_ratio(res, twin)
    return res, spec.severity, peak


#: Methods whose failure this process has logged already (the rest are counted, not shown).
_SAID_FAILING: set[str] = set()


def _trials(job: list[dict[str, Any]], localizers: dict[str, Any] | None,
            only: tuple[str, ...] | None = None, model: Any = None) -> tuple[list, list]:
    """Run the scenarios of one fault-free twin (same job, same seed): rows and unobservables.

    ``only`` keeps those methods (names of :func:`_methods`), ``model`` is the envelope the
    ``holmes`` method localizes with (default: the bundled model); the scripts that re-draw the
    sweeps (``scripts/healthy_holdout.py``) score a model exactly as the bench does this way.
    """
    from holmes_ml.bench.plugins import (
        call_localizer,
        fault_breadth,
        fault_ranks,
        suspect_device,
    )
    from holmes_ml.features import iteration_table
    from holmes_ml.localize import LocalizeConfig
    from holmes_ml.pipeline import analyze, localize_summaries, summarize_per_host
    from holmes_ml.simulator import simulate

    methods = _methods(localizers)
    if only is not None:
        unknown = sorted(set(only) - set(methods))
        if unknown:
            raise ValueError(f"unknown method {unknown[0]!r}; expected one of {sorted(methods)}")
        methods = {name: methods[name] for name in only}
    twin_res = simulate(_sim_config(job[0]))
    twin = iteration_table(twin_res.ops)["duration_s"]
    rows: list[dict[str, Any]] = []
    unobservable: list[dict[str, Any]] = []
    for sc in job:
        info = {k: v for k, v in sc.items() if k not in ("layout", "target", "iterations")}
        t_sim = time.perf_counter()
        if sc["fault"] is None:
            res, severity, peak = twin_res, 0.0, 1.0
        else:
            try:
                res, severity, peak = _simulate_scenario(sc, twin)
            except (ValueError, TypeError) as exc:
                logger.warning("scenario %s skipped: %s", info, exc)
                continue
            if peak < sc["delta"]:
                # The fault never made an iteration delta-irregular against the same job without
                # it: there is nothing to localize, so the trial is reported apart, not scored.
                unobservable.append({**info, "severity": severity, "peak_ratio": peak})
                continue
        t_sim = time.perf_counter() - t_sim
        ops = without_labels(res.ops)
        truth = {r for f in res.faults for r in fault_ranks(f.ranks, f.devices, res.topology)}
        devices = {d for f in res.faults for d in f.devices}
        crossing = {int(r) for f in res.faults for r in f.ranks}
        # every network device no log can tell from the faulty one ("device_top1_ties"), and
        # the ranks a suspect naming one of them holds (scored apart, as "top1_ties")
        flows_of = _flows_by_device(ops, res.topology) if devices else {}
        alike = set(devices) | _alike(flows_of, set(devices))
        tied = truth | {r for d in alike - devices for r in (
            fault_ranks(crossing, [d], res.topology) if d.startswith(("link:", "switch:"))
            else res.topology.ranks_on(d))}
        cfg = LocalizeConfig(delta=sc["delta"])
        for name, fn in methods.items():
            t0 = time.perf_counter()
            try:
                if fn == "holmes-nodes":  # the deployed path: each host scored on its own
                    sus = list(localize_summaries(summarize_per_host(ops, model, cfg),
                                                  res.topology, cfg).candidates)
                elif isinstance(fn, str):
                    sus = list(analyze(ops, res.topology, model=model if fn == "holmes" else fn,
                                       config=cfg).candidates)
                else:
                    sus = call_localizer(fn, ops, res.topology, sc["delta"])
                    world = res.topology.world_size
                    for s in sus:  # a suspect of no known type, or none of this job: an error
                        ranks = _suspect_ranks(s, res.topology)
                        if not ranks or min(ranks) < 0 or max(ranks) >= world:
                            raise ValueError(f"suspect {s!r} stands for no rank of this job "
                                             f"(ranks 0-{world - 1}), or for others")
                error = None
            except Exception as exc:  # noqa: BLE001 - a plug-in failing is a result, not a crash
                sus, error = [], f"{type(exc).__name__}: {exc}"[:300]
                # said once per method (its errors are counted in the report), with the
                # traceback under -v
                if name not in _SAID_FAILING:
                    _SAID_FAILING.add(name)
                    logger.warning("%s failed on %s: %s (its later failures are counted, not "
                                   "shown)", name, info, error)
                logger.debug("%s failed on %s", name, info, exc_info=True)
            row = {**info, "method": name, "severity": severity,
                   # what rebuilds the job (bl._sim_config of the row, layout parsed)
                   "iterations": sc["iterations"], "target": sc.get("target"),
                   "layout": json.dumps(sc["layout"], sort_keys=True),
                   "peak_ratio": round(peak, 4), "sim_seconds": round(t_sim, 3),
                   "seconds": time.perf_counter() - t0, "error": error}
            if truth:
                # a suspect broader than the faulty device (a spine above everyone, the host
                # of one slow GPU) names no fault, however many ranks it covers
                widest = fault_breadth(truth, sorted(devices), res.topology)
                row["top1"] = _hit(sus, truth, 1, res.topology, widest)
                row["top2"] = _hit(sus, truth, 2, res.topology, widest)
                row["top1_ties"] = _hit(sus, tied, 1, res.topology, widest)
                row["top1_split"] = _top1_split(sus, truth, res.topology, widest)
                # the best any log-only method can expect: one guess among the tied devices'
                # ranks (two guesses for top-2, each covering as many ranks as the fault)
                row["top1_bound"] = len(truth) / len(tied)
                row["top2_bound"] = min(1.0, 2 * len(truth) / len(tied))
                row["tied_ranks"] = len(tied - truth)
                first = suspect_device(sus[0]) if sus else None
                row["names_devices"] = first is not None
                row["device_top1"] = first in devices
                row["device_top1_ties"] = first in alike
                row["truth"] = ",".join(sorted(devices))
            else:
                # a ranking plug-in always names someone; one that may abstain says so (and
                # one that failed gave no healthy answer either)
                row["flagged"] = bool(sus) or error is not None if _abstains(fn) else True
            row["named"] = ",".join(str(suspect_device(c) or c) for c in sus[:2])
            rows.append(row)
    return rows, unobservable


#: Where :func:`run` writes every trial, beside the report.
TRIALS_FILE = "localize-trials.csv.gz"


def write_trials(trials: pd.DataFrame, out_dir: Any) -> str:
    """Write one row per trial and method (its scenario, with its layout as JSON, iterations
    and target ratio; severity, peak ratio, what the method named first and second, the scores
    and the error of a method that failed) to :data:`TRIALS_FILE` in ``out_dir``, to recompute
    a figure, rebuild a job or compare two methods trial by trial; returns the file name."""
    from pathlib import Path

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    trials.to_csv(Path(out_dir) / TRIALS_FILE, index=False)
    return TRIALS_FILE


def _abstains(fn: Any) -> bool:
    """Does the method return an empty list for a job it finds healthy? (The built-in holmes
    methods do; a ranking plug-in always names someone unless it says ``abstains``.)"""
    return isinstance(fn, str) or bool(getattr(fn, "abstains", False))


def _jobs(scs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Scenarios grouped by fault-free twin, biggest first (so a pool finishes them early)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for sc in scs:
        groups.setdefault(_twin_key(sc), []).append(sc)
    return sorted(groups.values(), key=lambda j: -j[0]["gpus"] * j[0]["iterations"] * len(j))


def _run_jobs(scs: list[dict[str, Any]], localizers: dict[str, Any] | None,
              workers: int, only: tuple[str, ...] | None = None) -> tuple[list, list]:
    jobs = _jobs(scs)
    rows: list[dict[str, Any]] = []
    unobservable: list[dict[str, Any]] = []
    if workers > 1 and len(jobs) > 1:
        import multiprocessing as mp
        import pickle
        from concurrent.futures import ProcessPoolExecutor

        try:
            pickle.dumps(localizers)
        except Exception as exc:  # noqa: BLE001 - any pickling failure means: run in-process
            logger.warning("localizers cannot be sent to worker processes (%s); 1 worker", exc)
            workers = 1
        if workers > 1:
            ctx = mp.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                for r, u in pool.map(_trials, jobs, [localizers] * len(jobs),
                                     [only] * len(jobs)):
                    rows += r
                    unobservable += u
            return rows, unobservable
    for job in jobs:
        r, u = _trials(job, localizers, only)
        rows += r
        unobservable += u
    return rows, unobservable


#: Axes of the breakdown table; ``delta`` is read over the delta-sweep trials only (elsewhere
#: delta is fixed at :data:`DELTA` with the kinds' default severities).
AXES: tuple[str, ...] = ("gpus", "dims", "delta", "kind", "pattern")


def _names_devices(trials: pd.DataFrame) -> bool:
    """Did the method name a device first in any of ``trials`` (not ranks only)?"""
    return "names_devices" in trials.columns and bool(
        trials["names_devices"].fillna(False).astype(bool).any())


def _accuracy(
    scs: list[dict[str, Any]], localizers: dict[str, Any] | None = None, workers: int = 1,
    only: tuple[str, ...] | None = None,
) -> tuple[list[dict], list[dict], pd.DataFrame]:
    """Score every method (or those named in ``only``) on ``scs``: (summary per method,
    breakdown per axis, trial rows)."""
    rows, unobservable = _run_jobs(scs, localizers, workers, only)
    df = pd.DataFrame(rows)
    summary: list[dict[str, Any]] = []
    breakdown: list[dict[str, Any]] = []
    if df.empty:
        return summary, breakdown, df
    if "sweep" not in df.columns:
        df["sweep"] = np.nan
    noisy_all = (df["kind"] != "healthy") & (df["sweep"] == "noisy")
    faulty = df[(df["kind"] != "healthy") & ~noisy_all]
    noisy = df[noisy_all]
    for (name,), sub in faulty.groupby(["method"], sort=False):
        k1, k2, n = int(sub["top1"].sum()), int(sub["top2"].sum()), len(sub)
        lo, hi = _wilson(k1, n)
        healthy = df[(df["kind"] == "healthy") & (df["method"] == name)]
        summary.append({"method": name, "trials": n, "top1": round(k1 / n, 3),
                        "top1_ci95": f"[{lo:.2f}, {hi:.2f}]", "top2": round(k2 / n, 3),
                        "top1_ties": round(float(sub["top1_ties"].mean()), 3),
                        "top1_split": round(float(sub["top1_split"].mean()), 3),
                        "top1_bound": round(float(sub["top1_bound"].mean()), 3),
                        "top2_bound": round(float(sub["top2_bound"].mean()), 3),
                        # (none for a method that names ranks only: not a 0 of a device)
                        **({"device_top1": round(float(sub["device_top1"].mean()), 3),
                            "device_top1_ties": round(float(sub["device_top1_ties"].mean()), 3)}
                           if _names_devices(sub) else
                           {"device_top1": None, "device_top1_ties": None}),
                        "healthy_trials": len(healthy),
                        "healthy_flagged": round(float(healthy["flagged"].mean()), 3)
                        if len(healthy) else None,
                        "healthy_flagged_ci95": _ci(int(healthy["flagged"].sum()), len(healthy))
                        if len(healthy) else None,
                        # jobs it failed on, of every kind (scored as misses; on a healthy
                        # job, as an alarm: no healthy answer was given)
                        "errors": int(df.loc[df["method"] == name, "error"].notna().sum()),
                        # what a method costs per job (a plug-in's own time included)
                        "median_seconds": round(float(
                            df.loc[df["method"] == name, "seconds"].median()), 3)})
        on_noise = noisy[noisy["method"] == name]
        if len(on_noise):
            k = int(on_noise["top1"].sum())
            summary[-1].update({"noisy_trials": len(on_noise),
                                "noisy_top1": round(k / len(on_noise), 3),
                                "noisy_top1_ci95": _ci(k, len(on_noise)),
                                "noisy_top2": round(float(on_noise["top2"].mean()), 3)})
    for key in AXES:
        part = faulty[faulty["sweep"] == "delta"] if key == "delta" else faulty
        for (name, val), sub in part.groupby(["method", key], sort=False):
            k1 = int(sub["top1"].sum())
            lo, hi = _wilson(k1, len(sub))
            breakdown.append({"by": key, "value": str(val), "method": name, "trials": len(sub),
                              "top1": round(k1 / len(sub), 3), "top1_ci95": f"[{lo:.2f}, {hi:.2f}]",
                              "top2": round(float(sub["top2"].mean()), 3),
                              "top1_ties": round(float(sub["top1_ties"].mean()), 3),
                              "peak_ratio": round(float(sub["peak_ratio"].median()), 3)})
            if _names_devices(sub):
                breakdown[-1].update(
                    device_top1=round(float(sub["device_top1"].mean()), 3),
                    device_top1_ties=round(float(sub["device_top1_ties"].mean()), 3))
    if unobservable:
        n_noisy = sum(u.get("sweep") == "noisy" for u in unobservable)
        breakdown.append({"by": "unobservable trials (excluded)", "value": len(unobservable),
                          "method": "-", "trials": len(unobservable), "top1": "", "top2": "",
                          "noisy": n_noisy})
    return summary, breakdown, df


#: Axes of the noisy-sweep table (:func:`_noisy_table`).
NOISY_AXES: tuple[str, ...] = ("jitter", "drift", "comm_drift", "dims", "kind", "pattern")


def _only_misses(trials: pd.DataFrame, kept: str, lost: str,
                 by: tuple[str, ...] = ("gpus", "dims", "delta", "kind", "pattern", "seed",
                                        "sweep")) -> list[dict[str, Any]]:
    """Faulty trials (keyed by ``by``) method ``kept`` gets right at top-1 and ``lost`` does not,
    over the trials both were scored on. Grid trials have no ``sweep``: they read as ``grid``."""
    keys = list(by)
    if not {kept, lost} <= set(trials.get("method", ())):
        return []
    rows = trials[(trials["kind"] != "healthy") & trials["method"].isin([kept, lost])]
    if "sweep" in keys:
        sweep = rows["sweep"].astype(object) if "sweep" in rows.columns else None
        rows = rows.assign(sweep="grid" if sweep is None else sweep.fillna("grid"))
    both = rows.groupby([*keys, "method"], dropna=False)["top1"].first().unstack("method")
    both = both.dropna().astype(bool)  # trials both methods were scored on
    gone = both[both[kept] & ~both[lost]]
    return gone.reset_index()[keys].to_dict("records")


def _node_only_misses(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Faulty trials whole-job ``holmes`` gets right at top-1 and ``holmes, per node`` (the
    deployed path, each host scored on its own) does not."""
    return _only_misses(trials, "holmes", "holmes, per node")


def _noisy_table(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Top-1 of every method on the faulty jobs of the noisy sweep (:func:`noisy_sweep`):
    over all of them, then by each of :data:`NOISY_AXES`."""
    if trials.empty or "sweep" not in trials.columns:
        return []
    noisy = trials[(trials["kind"] != "healthy") & (trials["sweep"] == "noisy")]
    parts: list[tuple[str, str, pd.DataFrame]] = [("all", "", noisy)]
    for key in NOISY_AXES:
        if key in noisy.columns:
            parts += [(key, str(v), sub) for v, sub in noisy.groupby(key)]
    rows = []
    for by, value, part in parts:
        for name, sub in part.groupby("method", sort=False):
            k = int(sub["top1"].sum())
            rows.append({"by": by, "value": value, "method": name, "trials": len(sub),
                         "top1": round(k / len(sub), 3), "top1_ci95": _ci(k, len(sub)),
                         "top2": round(float(sub["top2"].mean()), 3)})
    return rows


def _parquet_bytes(df: pd.DataFrame) -> int:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getbuffer().nbytes


def _speed(quick: bool) -> dict[str, float]:
    from holmes_ml.localize import LocalizeConfig
    from holmes_ml.localize.rules import localize_records
    from holmes_ml.pipeline import (
        _class_stats,
        _regular_rows,
        localize_summaries,
        per_host,
        summarize,
    )
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    gpus = 2048 if quick else 8192
    res = simulate(SimConfig(gpus=gpus, model="llama2-70b", tp=8, pp=8, iterations=4, seed=0,
                             faults=(FaultSpec.parse("gpu_slow:rank=1234,severity=0.5"),)))
    ops = without_labels(res.ops)
    t0 = time.perf_counter()
    summary = summarize(ops, model="rule")
    t_sum = time.perf_counter() - t0
    t0 = time.perf_counter()
    verdict = localize_summaries([summary], res.topology)
    t_loc = time.perf_counter() - t0
    # The deployed path: every host's agent summarizes its own ranks with the bundled model
    # (the hosts run side by side, so the window waits for the slowest), then the service
    # localizes from the summaries.
    from holmes_ml.models import default_model

    default_model()  # an agent loads it once, before its first window
    node_seconds: list[float] = []
    parts = []
    for _, sub in per_host(ops):
        t0 = time.perf_counter()
        parts.append(summarize(sub))
        node_seconds.append(time.perf_counter() - t0)
    # A full collection owed by the 1,024 summaries' allocations is not the verdict's cost:
    # left to fall inside it, it added about 0.25 s to some runs and not to others.
    gc.collect()
    t0 = time.perf_counter()
    node_verdict = localize_summaries(parts, res.topology)
    t_node_loc = time.perf_counter() - t0
    # Without the pre-filter: every operator copy goes through the rules, each measured
    # against the reference summarize would take.
    typical, _, _ = _class_stats(ops, regular=_regular_rows(ops, LocalizeConfig()))
    keep = [c for c in summary.abnormal.columns if c in ops.columns]
    everything = ops[keep].assign(
        score=1.0, excess_us=ops["duration_us"].to_numpy() - typical)
    for c in ("op", "group", "host", "group_kind"):
        if c in everything.columns:
            everything[c] = everything[c].astype(str)
    t0 = time.perf_counter()
    localize_records(everything, summary.groups, summary.iterations, res.topology,
                     replace(LocalizeConfig(), min_wait_us=0.0))
    t_full = time.perf_counter() - t0
    shipped = sum(_parquet_bytes(f) for f in (summary.abnormal, summary.iterations,
                                               summary.groups, summary.ranks))
    raw = _parquet_bytes(ops)
    top = verdict.candidates[0].ranks if verdict.candidates else ()
    node_top = node_verdict.candidates[0].ranks if node_verdict.candidates else ()
    return {
        "window_gpus": gpus,
        "window_localize_seconds": round(t_loc, 3),
        "window_summarize_seconds": round(t_sum, 3),
        "full_log_localize_seconds": round(t_full, 3),
        "speedup_vs_full_log": round(t_full / max(t_loc, 1e-9), 1),
        "bytes_raw_parquet": raw,
        "bytes_shipped_parquet": shipped,
        "bytes_reduction_pct": round(100.0 * (1 - shipped / raw), 2),
        "window_correct": float(top == (1234,)),
        "nodes": len(node_seconds),
        "node_summarize_seconds_median": round(float(np.median(node_seconds)), 3),
        "node_summarize_seconds_max": round(max(node_seconds), 3),
        "window_localize_seconds_from_nodes": round(t_node_loc, 3),
        # slowest node's summary, then the service's verdict (shipping time not included)
        "window_seconds_deployed": round(max(node_seconds) + t_node_loc, 3),
        "window_correct_from_nodes": float(node_top == (1234,)),
    }


def _plots(summary: list[dict], breakdown: list[dict], out_dir: Any) -> list[str]:
    """Bar chart of top-1 per method (with 95% CI) and top-1 per breakdown axis per method."""
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [r["method"] for r in summary]
    top1 = [r["top1"] for r in summary]
    ci = [tuple(float(x) for x in r["top1_ci95"].strip("[]").split(",")) for r in summary]
    lows = np.array([t - lo for t, (lo, _) in zip(top1, ci, strict=True)])
    highs = np.array([hi - t for t, (_, hi) in zip(top1, ci, strict=True)])
    err = np.vstack([lows, highs])
    # horizontal bars: method names (a plug-in's module:attribute) read whatever their length
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.35 * len(names)))
    ax.barh(names, top1, xerr=np.clip(err, 0, None), capsize=3, color="tab:blue")
    ax.invert_yaxis()  # the summary's order, top down
    ax.set_xlabel("top-1 accuracy (95 % interval)")
    ax.set_xlim(0, 1.05)
    ax.set_title(f"localization top-1, {summary[0]['trials'] if summary else 0} faulty trials")
    fig.tight_layout()
    fig.savefig(out / "localize-methods.png", dpi=110)
    plt.close(fig)
    files = ["localize-methods.png"]
    df = pd.DataFrame(breakdown)
    if len(df):
        axes_keys = [k for k in AXES if (df["by"] == k).any()]
        fig, axs = plt.subplots(1, len(axes_keys), figsize=(4 * len(axes_keys), 3.8), squeeze=False)
        for ax, key in zip(axs[0], axes_keys, strict=True):
            sub = df[df["by"] == key]
            table = sub.pivot_table(index="value", columns="method", values="top1", sort=False)
            trials = sub.groupby("value", sort=False)["trials"].max()
            if key in ("gpus", "delta"):
                table = table.sort_index(key=lambda idx: idx.astype(float))
            elif key == "dims":
                table = table.sort_index()  # "2-D ..." < "3-D ..." < ... < "6-D ..."
            table.index = [f"{v}\n(n={int(trials[v])})" for v in table.index]
            # one colour and marker per method, distinct beyond ten methods
            cmap = plt.get_cmap("tab10" if len(table.columns) <= 10 else "tab20")
            for i, col in enumerate(table.columns):
                ax.plot(range(len(table.index)), table[col].to_numpy(), label=str(col),
                        marker="os^vDP*Xph"[i % 10], color=cmap(i % cmap.N))
            ax.set_title(f"top-1 by {key}" + (" (sweep)" if key == "delta" else ""))
            ax.set_ylim(0, 1.05)
            ax.set_xticks(range(len(table.index)))
            ax.set_xticklabels(table.index, fontsize=7, rotation=30 if key in ("dims", "kind") else 0)
            ax.set_xlabel(key)
        # beside the last panel, where it hides no line
        axs[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        fig.tight_layout()
        fig.savefig(out / "localize-breakdown.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append("localize-breakdown.png")
    return files


def try_localizer(localizer: Any, gpus: int = 64, seed: int = 3) -> pd.DataFrame:
    """A localizer's first try, in seconds instead of the benchmark's minutes: one job of
    ``gpus`` GPUs (3-D layout) with each fault kind of :data:`SEVERITY` in turn, persistent
    from iteration 2, and the same job healthy, scored exactly as ``holmes bench localize``
    scores it beside the bundled Holmes.

    ``localizer`` is a callable or a ``module:attribute`` string (as ``--localizer`` takes
    it). Returns one row per method and job: ``kind``, ``method``, ``top1``, ``top2``,
    ``named`` (its first two suspects), ``truth`` (the faulty device), ``flagged`` (a healthy
    job given a suspect), ``error`` (what the contract of :mod:`holmes_ml.bench.plugins`
    refused, or what it raised) and ``seconds``. A fault no iteration showed (δ-irregular
    against the healthy job) is not scored, as in the benchmark.

    >>> from holmes_ml.bench.localize import try_localizer
    >>> rows = try_localizer("holmes_ml.bench.plugins:example_longest_comm")  # doctest: +SKIP
    >>> rows[rows["method"] != "holmes"][["kind", "top1", "error"]]  # doctest: +SKIP
    """
    from holmes_ml.bench.plugins import load_localizer

    if isinstance(localizer, str):
        name, fn = localizer, load_localizer(localizer)
    else:
        name, fn = getattr(localizer, "__name__", type(localizer).__name__), localizer
    job = [_sc(gpus, "3-D (tp,pp,dp)", kind, "persistent", seed) for kind in SEVERITY]
    job.append(_sc(gpus, "3-D (tp,pp,dp)", "healthy", "persistent", seed))
    rows, skipped = _trials(job, {name: fn}, only=("holmes", name))
    for sc in skipped:
        logger.warning("%s: the fault never made an iteration %g x slower than the healthy "
                       "job's; not scored", sc["kind"], sc["delta"])
    cols = ["kind", "method", "top1", "top2", "named", "truth", "flagged", "error", "seconds"]
    return pd.DataFrame(rows).reindex(columns=cols)


def run(
    quick: bool = False,
    localizers: dict[str, Any] | None = None,
    out_dir: Any = None,
    workers: int | None = None,
) -> BenchResult:
    """Accuracy of Holmes and the baselines, 8,192-GPU window time, speedup and bytes.

    Parameters
    ----------
    quick:
        The CI grid (64-256 GPUs, a few minutes) instead of the full one (64-8,192 GPUs).
    localizers:
        Extra methods ``name -> callable(ops, topology)`` scored on the same trials.
    out_dir:
        Where the PNG plots go (none when None).
    workers:
        Processes running trials (grouped by fault-free twin). None: 1 with ``quick``, else up to
        2 (the CPUs available).
    """
    import os

    t0 = time.perf_counter()
    if workers is None:
        workers = 1 if quick else max(1, min(2, os.cpu_count() or 1))
    _SAID_FAILING.clear()
    grid = scenarios(quick)
    summary, breakdown, trials = _accuracy(grid, localizers, workers)
    t_acc = time.perf_counter() - t0
    speed = _speed(quick)
    figures: dict[str, float] = {}
    tags = {"holmes": "holmes", "holmes, per node": "holmes_nodes",
            "3sigma+rule (no ML)": "rule"}
    for row in summary:
        if localizers and row["method"] in localizers:  # a plug-in: its headline figures too
            for col in ("top1", "top2", "errors"):
                figures[f"{row['method']}_{col}"] = row[col]
        if row["method"] in tags:
            tag = tags[row["method"]]
            figures[f"{tag}_top1"] = row["top1"]
            figures[f"{tag}_top2"] = row["top2"]
            figures[f"{tag}_top1_ties"] = row["top1_ties"]
            figures[f"{tag}_top1_split"] = row["top1_split"]
            figures["top1_bound"] = row["top1_bound"]
            figures["top2_bound"] = row["top2_bound"]
            figures[f"{tag}_device_top1"] = row["device_top1"]
            figures[f"{tag}_device_top1_ties"] = row["device_top1_ties"]
            if row["healthy_flagged"] is not None:
                figures[f"{tag}_healthy_flagged"] = row["healthy_flagged"]
            if "noisy_top1" in row:
                figures[f"{tag}_noisy_top1"] = row["noisy_top1"]
                figures[f"{tag}_noisy_top2"] = row["noisy_top2"]
    for row in breakdown:
        if row["method"] in ("holmes", "holmes, per node") and row["by"] in (
                "gpus", "dims", "delta"):
            tag = str(row["value"]).split(" ")[0].replace(".", "_")
            figures[f"{tags[row['method']]}_top1_{row['by']}_{tag}"] = row["top1"]
    if len(trials):
        key = ["gpus", "dims", "kind", "pattern", "seed", "delta"]
        per_trial = trials.groupby(key).agg(m=("seconds", "sum"), s=("sim_seconds", "first"))
        per_gpus = (per_trial["m"] + per_trial["s"]).groupby(level="gpus").mean()
        for g, sec in per_gpus.items():
            figures[f"seconds_per_trial_{g}"] = round(float(sec), 2)
    healthy_rows = _healthy_table(trials)
    for row in healthy_rows:
        if row["method"] == "holmes" and row["jobs"] == "sweep, jitter":
            figures[f"holmes_healthy_flagged_jitter_{row['value'].replace('.', '_')}"] = (
                row["share"])
    noisy_rows = _noisy_table(trials)
    for row in noisy_rows:
        if row["method"] == "holmes" and row["by"] == "jitter":
            figures[f"holmes_noisy_top1_jitter_{row['value'].replace('.', '_')}"] = row["top1"]
    misses: list[dict[str, Any]] = []
    noisy_misses: list[dict[str, Any]] = []
    false_alarms: list[dict[str, Any]] = []
    node_only_misses: list[dict[str, Any]] = []
    if len(trials):
        alarm = trials[(trials["method"] == "holmes") & (trials["kind"] == "healthy")
                       & trials["flagged"].fillna(False).astype(bool)]
        cols = [c for c in ("gpus", "dims", "seed", "iterations", *_SIM_KNOBS, "named")
                if c in alarm.columns]
        false_alarms = alarm[cols].to_dict("records")
        miss = trials[(trials["method"] == "holmes") & (trials["kind"] != "healthy")
                      & ~trials["top1"].astype(bool)]
        cols = [c for c in ("gpus", "dims", "delta", "kind", "pattern", "seed", "peak_ratio",
                            "truth", "named", "top2", "tied_ranks", *_SIM_KNOBS)
                if c in miss.columns]
        on_noise = (miss["sweep"] == "noisy").to_numpy()
        misses = miss.loc[~on_noise, cols].dropna(axis=1, how="all").to_dict("records")
        noisy_misses = miss.loc[on_noise, cols].to_dict("records")
        node_only_misses = _node_only_misses(trials)
        figures["trials_with_ties"] = int(
            (trials.loc[trials["method"] == "holmes", "tied_ranks"].fillna(0) > 0).sum())
    method_errors: dict[str, dict[str, Any]] = {}
    trial_file = None
    if len(trials):
        failed = trials[trials["error"].notna()]
        for name, sub in failed.groupby("method", sort=False):
            method_errors[str(name)] = {"trials": len(sub), "first": sub["error"].iloc[0]}
            logger.warning("%s failed on %d trial(s), scored as misses; the first: %s", name,
                           len(sub), sub["error"].iloc[0])
        if out_dir is not None:
            trial_file = write_trials(trials, out_dir)
    figures["accuracy_seconds"] = round(t_acc, 1)
    figures.update(speed)
    figures["bench_seconds"] = round(time.perf_counter() - t0, 1)
    return BenchResult(
        name="localize",
        figures=figures,
        config={"quick": quick, "workers": workers,
                "trials": sum(r["trials"] for r in summary[:1]),
                "methods": [r["method"] for r in summary],
                "trial_rows": trial_file,
                "seeds": {"grid": GRID_SEEDS[1] if quick else GRID_SEEDS[0],
                          "healthy_sweep": dict(zip(("draw", "first_seed"), HEALTHY_DRAW,
                                                    strict=True)),
                          "noisy_sweep": dict(zip(("draw", "first_seed"), NOISY_DRAW,
                                                  strict=True))},
                "scenarios": len(grid), "iterations": ITERATIONS, "delta": DELTA,
                "deltas": list(DELTAS), "delta_headroom": DELTA_HEADROOM,
                "big_jobs": {"layout": BIG_LAYOUT, "iterations": BIG_ITERATIONS,
                             "target_peak_ratio": BIG_TARGET},
                "layouts": LAYOUTS,
                "healthy_sweep": {"jobs": HEALTHY_SWEEP[1] if quick else HEALTHY_SWEEP[0],
                                  "gpus": list(HEALTHY_GPUS),
                                  "iterations": list(HEALTHY_ITERATIONS),
                                  "jitter": list(HEALTHY_JITTER), "drift": list(HEALTHY_DRIFT),
                                  "comm_drift": list(HEALTHY_COMM_DRIFT)},
                "noisy_sweep": {"jobs": NOISY_SWEEP[1] if quick else NOISY_SWEEP[0],
                                "target_peak_ratio": list(NOISY_TARGETS),
                                "kinds": list(NOISY_KINDS),
                                "knobs": "as the healthy sweep"},
                "severity": "gpu/host 0.5; nic/link/switch 2 (bandwidth / 3); delta sweep and >= 2,048 "
                            "GPUs: rescaled to a target peak iteration-time ratio",
                "scoring": "trials whose fault never made an iteration delta-irregular against "
                           "the fault-free twin are excluded and counted in the breakdown; "
                           "a suspect names the fault when it holds one of its ranks (a "
                           "link's or switch's: the ranks under it whose traffic crosses it) "
                           "and stands for no more ranks than the faulty device (a host does "
                           "not name one slow GPU of its own, a spine switch no leaf's fault); "
                           "top1/top2 are strict; top1_ties also accepts a suspect holding a "
                           "rank of a network device crossed by exactly the same flows as the "
                           "faulty one (no operator log can tell such devices apart); "
                           "top1_split gives 1/k for a first "
                           "candidate the verdict itself declares tied (tied_with) with k-1 "
                           "others, one of them the truth (the expected top-1 of breaking its "
                           "ties at random); top1_bound is the mean share of the fault's ranks "
                           "among those of it and its tied devices, the expected top-1 of a "
                           "perfect log-only method; top2_bound the same with two guesses "
                           "(twice the share, at most 1); "
                           "device_top1 asks the first candidate for the faulty device itself, "
                           "device_top1_ties also accepts a network device crossed by exactly "
                           "the same flows (a NIC and the link only its flows cross)"},
        goals={"holmes_top1": ">= 0.98", "holmes_top2": ">= 0.99",
               "holmes_healthy_flagged": "<= 0.01", "holmes_top1_gpus_8192": ">= 0.95",
               "holmes_top1_dims_6-D": ">= 0.95", "window_localize_seconds": "<= 3",
               "speedup_vs_full_log": ">= 10", "bytes_reduction_pct": ">= 97"},
        tables={"methods side by side": summary, "breakdown": breakdown,
                "healthy jobs given a suspect": healthy_rows,
                "faulty jobs on noisy clusters": noisy_rows},
        details={"holmes_misses": misses, "holmes_noisy_misses": noisy_misses,
                 "holmes_healthy_flagged_jobs": false_alarms,
                 "holmes_per_node_only_misses": node_only_misses,
                 "method_errors": method_errors},
        plots=_plots(summary, breakdown, out_dir) if out_dir is not None and summary else [],
    )
