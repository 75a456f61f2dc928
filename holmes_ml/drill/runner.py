"""Launch the drill job, collect its logs, localize, and judge the answer."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from holmes_ml.collect.torch_import import import_torch_distributed

logger = logging.getLogger(__name__)

#: Faults the drill can inject (``bandwidth`` needs root and network namespaces).
FAULTS: tuple[str, ...] = ("none", "straggler", "stall", "bandwidth", "heavy_stage")
#: A measured scheduler pause counts when it is this share of the median iteration time or
#: more: the irregularity factor of the localizer (delta = 1.1) by default.
PAUSE_FRACTION = 0.1


@dataclass(frozen=True)
class DrillConfig:
    """What to run and what to break.

    Parameters
    ----------
    ranks, tp, pp, dp:
        World size and layout; ``ranks`` must equal ``tp * pp * dp``.
    compute_s:
        Compute time (a sleep, so it does not load the CPU) of every rank per forward and per
        backward microbatch pass, like the kernels of a real step: it keeps the OS scheduler
        jitter of a loaded machine small against the iteration time.
    fault:
        One of :data:`FAULTS`. ``straggler``: ``straggler_s`` extra compute (sleep) per forward
        and backward microbatch on ``rank`` from ``start_iteration`` on (default: a third of
        the way in, so the localizer sees healthy steps first, as in a real incident);
        ``stall``: one pause of ``stall_s`` seconds on ``rank`` at ``stall_iteration``
        (default: the middle iteration); ``bandwidth`` (root only): every rank in its own
        network namespace, ``rank``'s veth capped with ``tc tbf`` for the whole run (see
        :mod:`holmes_ml.drill.netns`); ``heavy_stage``: a workload, not a fault - every rank
        of ``rank``'s pipeline stage computes ``straggler_s`` more per microbatch pass from
        the first step on, and the verdict must blame no device and name that stage.
    bandwidth_rate:
        ``tc tbf`` rate of the ``bandwidth`` fault on ``rank``'s veth (the drill moves ~30 kB
        per rank and step: the cap must stay visible against ``compute_s``).
    rank:
        Rank to break.
    iterations, microbatches, microbatch_size, hidden:
        Size of the job.
    out:
        Output directory (logs, ``drill.json``).
    timeout_s:
        The job is killed after this many seconds.
    """

    ranks: int = 8
    tp: int = 2
    pp: int = 2
    dp: int = 2
    fault: str = "straggler"
    rank: int = 0
    iterations: int = 20
    microbatches: int = 2
    microbatch_size: int = 8
    hidden: int = 64
    compute_s: float = 0.03
    straggler_s: float = 0.03
    stall_s: float = 1.5
    bandwidth_rate: str = "500kbit"
    start_iteration: int | None = None
    stall_iteration: int | None = None
    out: str = "drill-out"
    seed: int = 0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault={self.fault!r}: expected one of {', '.join(FAULTS)}")
        if self.ranks < 2:
            raise ValueError(f"ranks={self.ranks}: a rank alone runs no collective and has no "
                             "peer to compare with; expected at least 2")
        for name in ("tp", "pp", "dp", "microbatches"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected an integer >= 1")
        if self.ranks != self.tp * self.pp * self.dp:
            raise ValueError(
                f"ranks={self.ranks}: expected tp*pp*dp = {self.tp}*{self.pp}*{self.dp} = "
                f"{self.tp * self.pp * self.dp}"
            )
        for name in ("compute_s", "straggler_s", "stall_s"):
            if not 0 <= float(getattr(self, name)) <= _MAX_SECONDS:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected seconds >= 0 and at "
                                 f"most {_MAX_SECONDS:g}")
        if not 0 < float(self.timeout_s) <= _MAX_SECONDS:
            raise ValueError(f"timeout_s={self.timeout_s!r}: expected seconds > 0 and at most "
                             f"{_MAX_SECONDS:g}")
        if self.ranks > MAX_RANKS:
            raise ValueError(f"ranks={self.ranks}: expected at most {MAX_RANKS} (each rank is a "
                             "torch process of about 300 MB resident)")
        if not 0 <= self.rank < self.ranks:
            raise ValueError(f"rank={self.rank}: expected 0 <= rank < {self.ranks}")
        too_few = _too_few_steps(self)
        if too_few:
            raise ValueError(too_few)
        if self.fault == "heavy_stage" and (self.pp < 2 or self.dp < 2):
            # one stage has no other to be heavier than; in one replica a stage of slow GPUs
            # looks the same, and the localizer rightly names no stage
            raise ValueError(f"fault=heavy_stage with pp={self.pp}, dp={self.dp}: expected "
                             "pp >= 2 and dp >= 2")


def _monitor_and_rules() -> tuple[int, int, int]:
    """``(min_history, min_evidence, workload_min_iterations)`` of the localizer's defaults:
    the regular steps the irregularity monitor needs before it judges one, the late operator
    instances a candidate needs, and the steps the workload rules read."""
    from holmes_ml.features.iterations import IrregularityConfig
    from holmes_ml.localize.config import LocalizeConfig

    loc = LocalizeConfig()
    return IrregularityConfig().min_history, loc.min_evidence, loc.workload_min_iterations


def min_iterations(fault: str) -> int:
    """Fewest training steps (``iterations``) a drill of ``fault`` can be judged on, with the
    fault where the drill puts it by default.

    The irregularity monitor judges no step before ``min_history`` (3) regular ones, and the
    localizer compares the fault's steps with those healthy ones: a straggler, which starts a
    third of the way in, needs 9 steps (with 8 it starts at step 2 and the 2-rank drill's
    waits were the norm of its steps: missed; with 9 found); a stall, half way, 6. A
    workload present from the first step (``heavy_stage``) needs the
    ``workload_min_iterations`` (4) steps the workload rules read, and a step's compute is
    known once the next one follows: 5 (with 4 the 4-rank drill named no stage). A
    no-fault or a bandwidth drill (a cap from the first step), one step the monitor judges: 4.

    >>> {f: min_iterations(f) for f in FAULTS}
    {'none': 4, 'straggler': 9, 'stall': 6, 'bandwidth': 4, 'heavy_stage': 5}
    """
    history, evidence, workload = _monitor_and_rules()
    if fault == "straggler":
        n = 3 * history
        while n - n // 3 < evidence:  # slow long enough to be late more than once
            n += 1
        return n
    if fault == "stall":
        return 2 * history
    if fault == "heavy_stage":
        return max(history + 1, workload + 1)
    return history + 1


def _too_few_steps(cfg: DrillConfig) -> str:
    """Why the fault of ``cfg`` cannot show in its steps (the message of a ValueError), or
    ``""``: it must come after the irregularity monitor's warm-up, so that the localizer has
    healthy steps to compare it with (see :func:`min_iterations`)."""
    history, evidence, workload = _monitor_and_rules()
    n = int(cfg.iterations)
    kind = "no-fault" if cfg.fault == "none" else cfg.fault
    if cfg.fault == "straggler" and cfg.start_iteration is not None:
        first, last = history, n - evidence
        if first <= cfg.start_iteration <= last:
            return ""
        if first > last:
            return (f"iterations={n}: a straggler from step {cfg.start_iteration} needs the "
                    f"{history} regular steps the irregularity monitor needs before it judges "
                    f"one and {evidence} slow ones; expected at least {history + evidence}")
        return (f"start_iteration={cfg.start_iteration}: the straggler must start after the "
                f"{history} regular steps the irregularity monitor needs to judge one and stay "
                f"slow for {evidence} steps or more; expected {first} <= start_iteration <= "
                f"{last}")
    if cfg.fault == "stall" and cfg.stall_iteration is not None:
        if history <= cfg.stall_iteration < n:
            return ""
        if n <= history:
            return (f"iterations={n}: the irregularity monitor judges no step before {history} "
                    f"regular ones; expected at least {history + 1}")
        return (f"stall_iteration={cfg.stall_iteration}: the stall must come after the "
                f"{history} regular steps the irregularity monitor needs to judge one, within "
                f"the run; expected {history} <= stall_iteration <= {n - 1}")
    least = min_iterations(cfg.fault)
    if n >= least:
        return ""
    if cfg.fault == "straggler":
        why = (f"a straggler starts a third of the way in (step {max(n, 0) // 3}), before the "
               f"{history} regular steps the irregularity monitor needs to judge one")
    elif cfg.fault == "stall":
        why = (f"the stall comes half way (step {max(n, 0) // 2}), before the {history} "
               "regular steps the irregularity monitor needs to judge one")
    elif cfg.fault == "heavy_stage" and workload >= history:
        why = (f"the workload rules need {workload} steps whose compute is known (a step's "
               "once the next one follows)")
    else:
        why = f"the irregularity monitor judges no step before {history} regular ones"
    return f"iterations={n}: {why}; expected at least {least} for a {kind} drill"


#: Longest sleep or timeout a drill takes (a day): an infinite one overflowed the clock.
_MAX_SECONDS = 86_400.0
#: Most ranks a drill runs (each a torch process of about 300 MB resident).
MAX_RANKS = 32


@dataclass(frozen=True)
class DrillResult:
    """Outcome of one drill: ``ok`` is the exit criterion (found, or healthy when fault none).

    ``machine_pauses`` lists ``(rank, iteration, seconds)`` where a rank's own compute sleeps
    overslept, in total, by at least :data:`PAUSE_FRACTION` of the median iteration: the OS
    kept it off a CPU long enough to make that iteration irregular by itself (a loaded machine);
    and the shorter ones that explain the verdict, if any.
    For a drill without fault, ``pause_explained`` says the top candidate is a measured pause
    (its rank paused in one of the irregular iterations or of its evidence's, by such a share or
    by half the wait the evidence blames on it: :func:`_explaining_pauses`): a real host stall of
    the machine, found, rather than a false alarm of the localizer. ``ok`` stays False then:
    the drill was not healthy.
    """

    ok: bool
    fault: str
    rank: int
    top_ranks: tuple[int, ...]
    top_kind: str | None
    localizer: str
    job_seconds: float
    n_ops: int
    verdict: dict[str, Any] = field(default_factory=dict)
    log_paths: tuple[str, ...] = ()
    skipped: str = ""
    machine_pauses: tuple[tuple[int, int, float], ...] = ()
    pause_explained: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def free_port() -> int:
    """An unused TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job_config(cfg: DrillConfig, out: Path) -> dict[str, Any]:
    d = asdict(cfg)
    d["out"] = str(out / "logs")
    d["stall_iteration"] = (
        cfg.iterations // 2 if cfg.stall_iteration is None else cfg.stall_iteration
    )
    d["start_iteration"] = (
        cfg.iterations // 3 if cfg.start_iteration is None else cfg.start_iteration
    )
    d["host"] = socket.gethostname()
    # In the bandwidth drill every rank has its own network namespace and veth: network-wise
    # each rank is a host of its own (one NIC), and its logs say so, so that the localizer can
    # name the capped veth as that rank's NIC. Otherwise all ranks share one machine.
    d["host_per_rank"] = cfg.fault == "bandwidth"
    return d


def launch(
    cfg: DrillConfig, out: Path, prefixes: list[list[str]] | None = None,
    master_addr: str = "127.0.0.1", extra_env: dict[str, str] | None = None,
) -> float:
    """Run the N-process gloo job (on loopback unless ``prefixes`` put ranks in namespaces).

    Returns the job's wall time in seconds.
    """
    payload = json.dumps(_job_config(cfg, out))
    env = {**os.environ, "MASTER_ADDR": master_addr, "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(cfg.ranks), "OMP_NUM_THREADS": "1", **(extra_env or {})}
    t0 = time.perf_counter()
    procs = []
    errs = []
    for r in range(cfg.ranks):
        err = (out / f"rank{r}.stderr").open("w")
        errs.append(err)
        procs.append(subprocess.Popen(
            [*(prefixes[r] if prefixes else []), sys.executable, "-m", "holmes_ml.drill.job",
             payload],
            env={**env, "RANK": str(r)}, stdout=subprocess.DEVNULL, stderr=err,
        ))
    try:
        deadline = t0 + cfg.timeout_s
        for r, p in enumerate(procs):
            rc = p.wait(timeout=max(1.0, deadline - time.perf_counter()))
            if rc != 0:
                tail = (out / f"rank{r}.stderr").read_text()[-2000:]
                raise RuntimeError(f"drill rank {r} exited with code {rc}:\n{tail}")
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(
            f"the job did not finish within timeout_s={cfg.timeout_s:g} seconds (holmes drill "
            "--timeout); ranks still running were killed") from exc
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for e in errs:
            e.close()
    return time.perf_counter() - t0


def localize(paths: list[Path]) -> tuple[dict[str, Any], str]:
    """Verdict dict from :func:`holmes_ml.pipeline.analyze_paths`, or the fallback localizer."""
    try:
        from holmes_ml.pipeline import analyze_paths
    except ImportError as exc:
        logger.warning("holmes_ml.pipeline unavailable (%s); using the drill's fallback", exc)
        from holmes_ml.drill.fallback import arrival_localize

        ops = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
        return arrival_localize(ops), "fallback-arrival"
    try:
        return analyze_paths([str(p) for p in paths]).to_dict(), "holmes_ml.pipeline"
    except Exception as exc:  # noqa: BLE001 - a drill must report, not crash, on a broken pipeline
        logger.warning("holmes_ml.pipeline failed on the drill logs (%s); using the fallback", exc)
        from holmes_ml.drill.fallback import arrival_localize

        ops = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
        verdict = arrival_localize(ops)
        verdict["pipeline_error"] = f"{type(exc).__name__}: {exc}"
        return verdict, "fallback-arrival"


def judge(cfg: DrillConfig, verdict: dict[str, Any]) -> tuple[bool, tuple[int, ...], str | None]:
    """Did the injected rank come back on top (or, for ``none``, no candidate at all; for
    ``heavy_stage``, no candidate and its stage named as a workload finding)?"""
    cands = verdict.get("candidates") or []
    if cfg.fault == "heavy_stage":
        stage = cfg.rank // (cfg.tp * cfg.dp)
        main = verdict.get("workload") or {}
        named = [w for w in (main, *main.get("others", ())) if w.get("kind") == "stage-imbalance"
                 and (w.get("coords") or {}).get("pp") == stage]
        top = cands[0] if cands else {}
        return (not cands and bool(named), tuple(int(r) for r in top.get("ranks", [])),
                top.get("kind"))
    if not cands:
        return cfg.fault == "none", (), None
    top = cands[0]
    ranks = tuple(int(r) for r in top.get("ranks", []))
    if cfg.fault == "none":
        return False, ranks, top.get("kind")
    # the top suspect must be specific: contain the rank and not half the job
    ok = cfg.rank in ranks and len(ranks) < max(2, cfg.ranks / 2)
    return ok, ranks, top.get("kind")


def machine_pauses(out: Path) -> pd.DataFrame:
    """Per ``(rank, iteration)`` the total oversleep of the rank's compute sleeps, in seconds.

    Read from the ``sched-rank*.json`` files the ranks write (:mod:`holmes_ml.drill.job`); an
    empty frame when there are none.
    """
    frames = []
    for path in sorted(Path(out).glob("sched-rank*.json")):
        d = json.loads(path.read_text())
        s = d["oversleep_s"]
        frames.append(pd.DataFrame({"rank": int(d["rank"]), "iteration": range(len(s)),
                                    "oversleep_s": s}))
    if not frames:
        return pd.DataFrame({"rank": [], "iteration": [], "oversleep_s": []})
    return pd.concat(frames, ignore_index=True)


def _median_iteration_s(paths: list[Path]) -> float:
    ops = pd.concat([pd.read_parquet(p, columns=["iteration", "start_ns", "duration_us"])
                     for p in paths], ignore_index=True)
    end = ops["start_ns"] + ops["duration_us"] * 1e3
    span = end.groupby(ops["iteration"]).max() - ops["start_ns"].groupby(ops["iteration"]).min()
    return float(span.median()) / 1e9 if len(span) else 0.0


def _explaining_pauses(verdict: dict[str, Any], pauses: pd.DataFrame,
                       step_s: float | None = None) -> pd.DataFrame:
    """The measured pauses (:func:`machine_pauses` rows) that make the top candidate a real
    host stall rather than a false alarm; empty when none does.

    A pause on the candidate's rank counts in an irregular iteration or one of its evidence's
    iterations when it lasts :data:`PAUSE_FRACTION` of the median iteration ``step_s`` or more,
    or half the longest wait the evidence puts on that iteration or more: the ranks' own probe
    saw the pause the localizer found, even one too short to make its iteration irregular.
    With ``step_s`` None every pause given counts.
    """
    cands = verdict.get("candidates") or []
    if not cands or not len(pauses) or cands[0].get("kind") not in ("host", "gpu"):
        return pauses.iloc[:0]
    top = cands[0]
    its = set(verdict.get("irregular_iterations") or [])
    its |= {int(e["iteration"]) for e in top.get("evidence", [])}
    mine = pauses[pauses["rank"].isin([int(r) for r in top.get("ranks", [])])
                  & pauses["iteration"].isin(its)]
    if step_s is None or not len(mine):
        return mine
    wait_s: dict[int, float] = {}
    for e in top.get("evidence", []):
        it = int(e["iteration"])
        wait_s[it] = max(wait_s.get(it, 0.0), float(e.get("weight") or 0.0) / 1e6)
    enough = [paused >= min(PAUSE_FRACTION * step_s, 0.5 * wait_s.get(int(it), 0.0) or math.inf)
              for it, paused in zip(mine["iteration"], mine["oversleep_s"], strict=True)]
    return mine[enough]


def run_drill(cfg: DrillConfig) -> DrillResult:
    """Launch, log, localize and judge; write ``<out>/drill.json``.

    Raises
    ------
    ImportError
        PyTorch (``torch.distributed``) cannot be imported by this interpreter, which the ranks
        run on; checked before any rank is started. The message says how to install it.
    RuntimeError
        A rank exited with an error (the message ends with its stderr) or the job outlived
        ``cfg.timeout_s``.

    Examples
    --------
    >>> res = run_drill(DrillConfig(fault="straggler", rank=5, out="/tmp/d"))  # doctest: +SKIP
    >>> res.ok, res.top_ranks  # doctest: +SKIP
    (True, (5,))
    """
    # Every rank would die of it, each with its own traceback: say it once, up front.
    import_torch_distributed("holmes drill runs a real multi-process gloo job with PyTorch")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    # an earlier drill in the same directory: its logs (of ranks this one may not have) would be
    # read with this one's, its scheduler records judged with them
    stale = [*out.glob("sched-rank*.json"), *(out / "logs").glob("commops-rank*.parquet")]
    if stale:
        logger.info("%s: removing %d file(s) of an earlier drill", out, len(stale))
    for path in stale:
        path.unlink()
    if cfg.fault == "bandwidth":
        from holmes_ml.drill.netns import bandwidth_unavailable, namespaces

        reason = bandwidth_unavailable()
        if reason:
            result = DrillResult(False, cfg.fault, cfg.rank, (), None, "", 0.0, 0, skipped=reason)
            (out / "drill.json").write_text(json.dumps(result.to_dict(), indent=2))
            return result
        with namespaces(cfg.ranks, cfg.rank, rate=cfg.bandwidth_rate) as (prefixes, master):
            seconds = launch(cfg, out, prefixes, master, {"GLOO_SOCKET_IFNAME": "eth0"})
    else:
        seconds = launch(cfg, out)
    paths = sorted((out / "logs").glob("commops-rank*.parquet"))
    n_ops = sum(len(pd.read_parquet(p, columns=["seq"])) for p in paths)
    verdict, who = localize(paths)
    ok, top_ranks, top_kind = judge(cfg, verdict)
    measured = machine_pauses(out)
    step_s = _median_iteration_s(paths) if paths else 0.0
    pauses = measured
    if len(pauses) and paths:
        pauses = pauses[pauses["oversleep_s"] >= PAUSE_FRACTION * step_s]
        if len(pauses):
            logger.warning(
                "the machine paused drill ranks by up to %.0f ms (%d rank-iterations): a loaded "
                "machine adds real host stalls to the drill", 1e3 * pauses["oversleep_s"].max(),
                len(pauses))
    explaining = (_explaining_pauses(verdict, measured, step_s)
                  if cfg.fault == "none" and not ok else measured.iloc[:0])
    explained = len(explaining) > 0
    # the pauses listed include those that explain the verdict, shorter than the share or not
    pauses = pd.concat([pauses, explaining]).drop_duplicates(["rank", "iteration"]).sort_values(
        ["rank", "iteration"]) if explained else pauses
    result = DrillResult(
        ok, cfg.fault, cfg.rank, top_ranks, top_kind, who, round(seconds, 3), n_ops, verdict,
        tuple(str(p) for p in paths),
        machine_pauses=tuple((int(r.rank), int(r.iteration), round(float(r.oversleep_s), 4))
                             for r in pauses.itertuples()),
        pause_explained=explained,
    )
    (out / "drill.json").write_text(json.dumps({"config": asdict(cfg), **result.to_dict()},
                                               indent=2, default=str))
    return result
