"""``holmes bench agents``: the deployed path end to end, scored on the localization bench's trials.

``holmes bench localize`` scores the deployed path ("holmes, per node") by summarizing each
host's whole window at once. A live agent does not see the window: it follows its ranks' log
files as they grow and scores each *complete* iteration with a few earlier iterations of
context. This bench measures what that gives.

For each trial (scenarios of :mod:`holmes_ml.bench.localize`: same seeds, same fault sizing,
same unobservable-trial exclusion, same top-1/top-2 scoring):

1. the simulated job's logs are split by host and *replayed*: one iteration at a time is
   appended to each host's CSV log;
2. after every iteration each host's real :class:`~holmes_ml.serve.agent.Agent` (own SQLite
   outbox, the bundled model) takes one step - read what the file gained, summarize the
   iterations that are complete, post the batch;
3. a real ``holmes serve`` on loopback (one process for the whole bench, one job per trial)
   ingests the batches; after the last iteration the agents flush, and the service's verdict
   (``POST /v1/jobs/{job}/analyze``) is the method's answer.

Whole-job ``holmes`` and the whole-window per-host scoring run on the same trials beside it. The
figures also give the bytes the agents posted against the raw CSV logs they read, and how long
one agent step (read + summarize + post) takes.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from holmes_ml.bench.record import BenchResult
from holmes_ml.bench.serve import TOKEN as _TOKEN

logger = logging.getLogger(__name__)

LIVE = "holmes, live agents"
#: Methods scored on every trial, in this order.
METHODS: tuple[str, ...] = ("holmes", "holmes, per node", LIVE)
#: Grid seeds replayed at 64-256 GPUs (full run), healthy-sweep jobs replayed, and the seed of
#: the 2,048-GPU llama2-70b tp8 pp8 trials (one per fault kind, and the healthy one).
GRID_SEEDS: tuple[int, ...] = (11, 12)
HEALTHY_JOBS = 40
BIG_GPUS = 2048
BIG_SEED = 11


def cases(quick: bool) -> list[dict[str, Any]]:
    """The trials replayed: scenarios of :func:`holmes_ml.bench.localize.scenarios`.

    Full run: the grid at 64-256 GPUs with seeds :data:`GRID_SEEDS` (every layout, fault kind
    and pattern at delta 1.1), the first :data:`HEALTHY_JOBS` jobs of the healthy sweep (noisy,
    drifting clusters), and the :data:`BIG_GPUS`-GPU tp8 trials of seed :data:`BIG_SEED`.
    ``quick``: a 64-GPU slow GPU and the same job healthy.
    """
    from holmes_ml.bench.localize import scenarios

    every = scenarios(False)
    grid = [s for s in every if s.get("sweep") is None]
    if quick:
        return [s for s in grid if s["gpus"] == 64 and s["seed"] == 11
                and s["dims"].startswith("3-D") and s["kind"] in ("gpu_slow", "healthy")]
    small = [s for s in grid if s["gpus"] <= 256 and s["seed"] in GRID_SEEDS]
    big = [s for s in grid if s["gpus"] == BIG_GPUS and s["seed"] == BIG_SEED]
    healthy = [s for s in every if s.get("sweep") == "healthy"][:HEALTHY_JOBS]
    return small + big + healthy


@dataclass(frozen=True)
class LiveAgents:
    """A localizer plug-in (``(ops, topology) -> candidates``) that replays ``ops`` through one
    real agent per host into the service at ``url``.

    Each call files a new job, writes the agents' logs and outboxes under ``root/<job>`` (removed
    afterwards) and its measurements to ``root/<job>.json``. The candidates are the service's
    verdict (objects with ``device``, ``ranks``, ``score``...). A service error, or a batch the
    service refused, raises, and :func:`run` fails when any replay did: the bench measures the
    deployed path, not its absence.
    """

    url: str
    root: str
    token: str = _TOKEN
    #: the verdict holds an empty list when the job looks healthy (scored as not flagged)
    abstains: bool = True

    def __call__(self, ops: pd.DataFrame, topology: Any) -> list[Any]:
        import httpx

        from holmes_ml.serve.agent import Agent, AgentConfig

        job = "t" + uuid.uuid4().hex[:12]
        base = Path(self.root) / job
        agents: list[tuple[Agent, Path, dict[Any, pd.DataFrame]]] = []
        step_s: list[float] = []
        t_all = time.perf_counter()
        try:
            for host, part in ops.groupby(ops["host"].astype(str), observed=True, sort=True):
                folder = base / host
                folder.mkdir(parents=True)
                cfg = AgentConfig(follow=folder, server=self.url, job=job, token=self.token,
                                  source=host)
                by_it = dict(tuple(part.groupby("iteration", sort=False)))
                agents.append((Agent(cfg), folder / "ops.csv", by_it))
            agents[0][0].put_topology(topology.to_dict())
            iterations = np.unique(ops["iteration"].to_numpy())
            for i, it in enumerate(iterations):
                last = i == len(iterations) - 1
                for agent, log, by_it in agents:
                    rows = by_it.get(it, ops.iloc[:0])
                    rows.to_csv(log, mode="a", header=i == 0, index=False)
                    t0 = time.perf_counter()
                    agent.step(flush=last)
                    step_s.append(time.perf_counter() - t0)
            for agent, _, _ in agents:
                counts = agent.outbox.counts()
                if counts.get("pending") or counts.get("rejected") or agent.stats.failures:
                    raise RuntimeError(f"agent {agent.config.source}: batches not delivered "
                                       f"({counts}, {agent.stats.failures} failures)")
            replay_s = time.perf_counter() - t_all
            t0 = time.perf_counter()
            r = httpx.post(f"{self.url}/v1/jobs/{job}/analyze", timeout=600,
                           headers={"Authorization": f"Bearer {self.token}"})
            r.raise_for_status()
            verdict = r.json()
            analyze_s = time.perf_counter() - t0
            if verdict.get("error"):
                raise RuntimeError(f"service could not localize job {job}: {verdict['error']}")
            stats = {
                "job": job, "gpus": int(ops["rank"].nunique()), "hosts": len(agents),
                "iterations": len(iterations),
                "raw_bytes": sum(a.stats.raw_bytes for a, _, _ in agents),
                "sent_bytes": sum(a.stats.sent_bytes for a, _, _ in agents),
                "batches": sum(a.stats.batches_sent for a, _, _ in agents),
                "step_seconds": step_s, "replay_seconds": replay_s,
                "analyze_seconds": analyze_s,
            }
            (Path(self.root) / f"{job}.json").write_text(json.dumps(stats))
        finally:
            for agent, _, _ in agents:
                agent.close()
            shutil.rmtree(base, ignore_errors=True)
        return [SimpleNamespace(**c) for c in verdict.get("candidates", [])]


def _traffic(root: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Pooled replay measurements (figures) and one row per GPU count (table)."""
    stats = [json.loads(p.read_text()) for p in sorted(root.glob("t*.json"))]
    if not stats:
        return {}, []
    steps = np.concatenate([np.asarray(s["step_seconds"], dtype=float) for s in stats])
    raw = sum(s["raw_bytes"] for s in stats)
    sent = sum(s["sent_bytes"] for s in stats)
    figures = {
        "replays": len(stats),
        "agent_steps": len(steps),
        "agent_step_seconds_median": round(float(np.median(steps)), 4),
        "agent_step_seconds_p99": round(float(np.quantile(steps, 0.99)), 4),
        "agent_step_seconds_max": round(float(steps.max()), 4),
        "bytes_sent_share": round(sent / raw, 4) if raw else 0.0,
        "analyze_seconds_max": round(max(s["analyze_seconds"] for s in stats), 3),
    }
    rows = []
    for gpus in sorted({s["gpus"] for s in stats}):
        part = [s for s in stats if s["gpus"] == gpus]
        st = np.concatenate([np.asarray(s["step_seconds"], dtype=float) for s in part])
        r, b = sum(s["raw_bytes"] for s in part), sum(s["sent_bytes"] for s in part)
        its = sorted({s["iterations"] for s in part})
        rows.append({
            "gpus": gpus, "replays": len(part), "hosts": part[0]["hosts"],
            "iterations": f"{its[0]}–{its[-1]}" if len(its) > 1 else str(its[0]),
            "raw_MB": round(r / 1e6, 1), "sent_MB": round(b / 1e6, 2),
            "bytes_fewer_pct": round(100 * (1 - b / r), 2) if r else None,
            "step_s_median": round(float(np.median(st)), 4),
            "step_s_max": round(float(st.max()), 4),
            "replay_s_median": round(float(np.median([s["replay_seconds"] for s in part])), 2),
            "analyze_s_max": round(max(s["analyze_seconds"] for s in part), 3),
        })
    return figures, rows


def _by_trial_misses(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Faulty trials whole-job holmes names at top-1 and the live agents do not."""
    from holmes_ml.bench.localize import _only_misses

    return _only_misses(trials, "holmes", LIVE, by=("gpus", "dims", "kind", "pattern", "seed"))


def _healthy_flagged(trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Healthy jobs the live agents gave a suspect, with what they named and the job's knobs."""
    rows = trials[(trials["kind"] == "healthy") & (trials["method"] == LIVE)
                  & trials["flagged"].astype(bool)]
    cols = [c for c in ("gpus", "dims", "seed", "sweep", "jitter", "drift", "comm_drift", "named")
            if c in rows.columns]
    return rows[cols].to_dict("records")


def run(quick: bool = False, workers: int = 2) -> BenchResult:
    """Replay :func:`cases` through live agents and a real service; score beside whole-job
    holmes and the whole-window per-host path."""
    from holmes_ml.bench.localize import _accuracy
    from holmes_ml.bench.serve import _start

    scs = cases(quick)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="holmes-bench-agents-") as tmp:
        root = Path(tmp)
        proc, url = _start(root / "serve.db")
        try:
            live = LiveAgents(url=url, root=str(root))
            summary, breakdown, trials = _accuracy(scs, {LIVE: live}, workers=workers,
                                                   only=METHODS)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        traffic, traffic_rows = _traffic(root)
    scored = int((trials["method"] == LIVE).sum()) if len(trials) else 0
    if traffic.get("replays", 0) != scored:
        # _trials logs a plug-in's exception and scores it as "named nothing", which on a
        # healthy job would read as a correct answer: a replay that failed voids the run
        raise RuntimeError(f"holmes bench agents: {scored - traffic.get('replays', 0)} of "
                           f"{scored} replays failed (see the warnings above)")
    seconds = time.perf_counter() - t0
    figures: dict[str, Any] = {}
    names = {"holmes": "holmes", "holmes, per node": "nodes", LIVE: "live"}
    for row in summary:
        short = names[row["method"]]
        figures[f"{short}_top1"] = row["top1"]
        figures[f"{short}_top2"] = row["top2"]
        figures[f"{short}_healthy_flagged"] = row["healthy_flagged"]
    for row in breakdown:
        if row["by"] == "gpus" and row["method"] in names:
            figures[f"{names[row['method']]}_top1_gpus_{row['value']}"] = row["top1"]
    figures.update(traffic)
    figures["faulty_trials"] = summary[0]["trials"] if summary else 0
    figures["healthy_trials"] = summary[0]["healthy_trials"] if summary else 0
    figures["seconds"] = round(seconds)
    return BenchResult(
        name="agents",
        figures=figures,
        config={"quick": quick, "workers": workers, "cases": len(scs),
                "grid_seeds": list(GRID_SEEDS), "healthy_jobs": HEALTHY_JOBS,
                "big": {"gpus": BIG_GPUS, "seed": BIG_SEED},
                "agent": "holmes_ml.serve.agent.Agent with the bundled model, history 10, "
                         "one step per replayed iteration, flush after the last",
                "service": "holmes serve on 127.0.0.1 (uvicorn subprocess, SQLite)"},
        details={"live_only_misses": _by_trial_misses(trials) if len(trials) else [],
                 "live_healthy_flagged_jobs": _healthy_flagged(trials) if len(trials) else []},
        tables={"methods": summary, "top-1 by GPU count": [r for r in breakdown
                                                           if r["by"] == "gpus"],
                "replay traffic and agent step time by GPU count": traffic_rows},
    )
