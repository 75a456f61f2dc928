"""The simulation engine: 1F1B pipeline schedule, collectives and P2P, vectorized over ranks.

Physics
-------
* Every rank has a clock (microseconds). Work runs stage by stage in a topological order of the
  1F1B schedule (a forward of microbatch ``m`` on stage ``s`` needs the forward of ``m`` on
  ``s-1``; a backward needs the backward on ``s+1``), each step vectorized over all ranks of the
  stage, shaped ``(dp, ep, cp, tp)``.
* A collective completes at the **last arrival** of its members plus an alpha-beta transfer time
  (ring algorithm: ``steps * alpha + factor * nbytes / busbw``; NVLink inside a host, NIC
  bandwidth once the group spans hosts). Each rank logs ``completion - own arrival``, so a slow
  GPU's own collectives look short and its peers' look long.
* P2P: a send is eager (takes its transfer time); the matching recv completes at
  ``max(recv posted, send posted) + transfer`` - a recv waits for its send.
* Delays propagate TP -> PP -> DP through these dependencies; iterations chain on each rank's
  clock (the next forward starts when the rank finished its optimizer step).

Labels
------
The same seed is simulated with and without the faults in one pass (a leading *scenario* axis
shares every random draw: 0 the job, 1 its fault-free twin, and with several faults 2 + i each
fault ``i`` alone). An op is ``affected`` when its duration exceeds its
fault-free twin's by more than :data:`ABNORMAL_REL` (15 %) plus :data:`ABNORMAL_ABS_US` (20 us):
the relative part ignores tiny ripples, the absolute part protects very short ops. It is
``abnormal`` when it is affected *and* longer than the fault-free copies of the same op step
usually are: above their median plus :data:`ABNORMAL_SPREAD` (3) robust standard deviations
(1.4826 x MAD over the step's copies on its pipeline stage, all ranks). The second condition is
what a log can show: a waiting collective whose wait grew 20 % but stays inside the spread that
jitter gives the same step without any fault looks exactly like a normal copy (``affected``
keeps the causal label). ``fault_id`` names, for an abnormal op, the fault that caused it (-1
for the others): with one fault that fault; with several the fault that alone lengthens the op
most over its twin (each fault's own scenario), so a delay that propagated from a GPU is not
blamed on a NIC fault of another severity scale. An op no fault lengthens alone (only their
combination does) falls back to the most severe active fault whose device the op's group
touches, else the most severe fault active in that iteration.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from holmes_ml._stats import MAD_TO_SD
from holmes_ml.simulator.calibrate import Calibration, load_calibration
from holmes_ml.simulator.cluster import Cluster, Family
from holmes_ml.simulator.config import SimConfig
from holmes_ml.simulator.faults import BANDWIDTH_KINDS, ResolvedFault, resolve_faults
from holmes_ml.simulator.models import HARDWARE, MODELS

logger = logging.getLogger(__name__)

ABNORMAL_REL = 0.15
ABNORMAL_ABS_US = 20.0
#: An abnormal op is longer than its step's fault-free median + this many robust std devs.
ABNORMAL_SPREAD = 3.0
#: Epoch of iteration 0 (fixed so the same seed gives byte-identical files): 2026-01-01T00:00Z.
EPOCH_NS = 1_767_225_600_000_000_000
BYTES_PER_ELEM = 2  # bf16 activations, gradients and parameters

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv")
_OP_CODE = {o: i for i, o in enumerate(OPS)}
#: (ring steps per alpha, bandwidth factor) as a function of group size p
_ALGO = {
    "all_reduce": (lambda p: 2 * (p - 1), lambda p: 2 * (p - 1) / p),
    "all_gather": (lambda p: p - 1, lambda p: (p - 1) / p),
    "reduce_scatter": (lambda p: p - 1, lambda p: (p - 1) / p),
    "all_to_all": (lambda p: p - 1, lambda p: (p - 1) / p),
    "send": (lambda p: 1, lambda p: 1.0),
}


def _usual_ceiling(dur0: np.ndarray | None) -> float:
    """Longest duration the fault-free copies of one op step usually reach: their median plus
    :data:`ABNORMAL_SPREAD` robust standard deviations (1.4826 x median absolute deviation)."""
    assert dur0 is not None  # only called with the twin
    med = float(np.median(dur0))
    return med + ABNORMAL_SPREAD * MAD_TO_SD * float(np.median(np.abs(dur0 - med)))


def _pairs(pairs: list[tuple[str, str]]) -> str:
    """``all_reduce/tp, send/pp`` for messages."""
    return ", ".join(f"{op}/{kind}" for op, kind in pairs)


def iteration_span_us(ops: pd.DataFrame) -> float:
    """Job-wide span of one iteration's rows: last end minus first start, microseconds."""
    start = ops["start_ns"].to_numpy()
    t0 = int(start.min())
    end = (start - t0) / 1000.0 + ops["duration_us"].to_numpy()
    return float(end.max())


@dataclass
class _Chunk:
    """Rows of one op step on one stage (scenario 0 values, plus fault-free durations)."""

    ranks: np.ndarray
    op: int
    gid: np.ndarray
    seq: int
    nbytes: int
    start: np.ndarray
    dur: np.ndarray
    dur0: np.ndarray | None
    peer: np.ndarray | None
    fid: np.ndarray | None
    #: durations with each fault alone, (faults, rows); only with several faults
    solo: np.ndarray | None = None


class Engine:
    """One simulated job; iterate :meth:`iterations` to get one ops DataFrame per iteration."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        calibration: Calibration | None = None,
        compute_scale: float | None = None,
    ) -> None:
        self.cfg = cfg
        self._xfer_drift = 1.0  # comm_drift factor of the current iteration
        self.lay = cfg.layout
        self.spec = MODELS[cfg.model]
        self.hw = HARDWARE[cfg.hardware]
        self.cluster = Cluster(self.lay, cfg.pod_hosts, cfg.spines)
        self.rng = np.random.default_rng(cfg.seed)
        # workload draws on a stream of their own: the rest of the job is as without them
        self._seq_rng = np.random.default_rng([cfg.seed, 2])
        fault_rng = np.random.default_rng([cfg.seed, 1])
        self.faults: list[ResolvedFault] = resolve_faults(
            cfg.faults, self.cluster, cfg.iterations, self.lay.microbatches, fault_rng
        )
        if calibration is None and cfg.calibrate_from is not None:
            calibration = load_calibration(cfg.calibrate_from)
        self.calibration: Calibration | None = calibration
        # scenarios: the job and its fault-free twin; with several faults also each fault
        # alone, whose delays tell which fault an abnormal op carries (see _frame)
        self.S = 1 if not self.faults else 2 + (len(self.faults) if len(self.faults) > 1 else 0)
        self.compute_scale = 1.0
        lay = self.lay
        self.stage_shape = (lay.dp, lay.ep, lay.cp, lay.tp)
        self.n_stage = int(np.prod(self.stage_shape))
        self.layers_per_stage = self.spec.layers // lay.pp
        m = lay.microbatches
        self.chunks = int(max(1, min(6, self.layers_per_stage, 96 // (2 * m))))
        self._compute_model()
        if compute_scale is None and self.calibration is not None:  # (not in a probe run)
            self._check_calibration(self.calibration)
        if compute_scale is None and self.calibration is not None and self.calibration.iteration_us:
            compute_scale = self._fit_compute_scale(self.calibration.iteration_us)
        if compute_scale is not None:
            self.compute_scale = compute_scale
            self.t_fwd_us *= compute_scale
            self.t_bwd_us *= compute_scale
            self.t_opt_us *= compute_scale
            self.est_iter_us *= compute_scale
        self._schedule = self._topological_1f1b()
        self._seq: dict[tuple[str, int], int] = {}
        self._categories()

    # ----------------------------------------------------------------- model figures
    def _compute_model(self) -> None:
        spec, lay, hw = self.spec, self.lay, self.hw
        cfg = self.cfg
        tokens = cfg.micro_batch_size * spec.seq_len / lay.cp  # this rank's, per microbatch
        per_layer = spec.attn_params_per_layer + spec.topk * spec.expert_params_per_layer
        dense = 2.0 * per_layer * tokens / lay.tp
        # scores and values: each of the rank's tokens attends to its whole sequence
        attn = 4.0 * spec.seq_len * tokens * spec.hidden / lay.tp
        fwd_flops = self.layers_per_stage * (dense + attn)
        self.t_fwd_us = fwd_flops / hw.flops * 1e6
        self.t_bwd_us = 2.0 * self.t_fwd_us
        act = int(tokens * spec.hidden * BYTES_PER_ELEM)
        layers_per_chunk = self.layers_per_stage / self.chunks
        # Megatron TP: two all-reduces of the activations per layer (attention out, MLP out).
        self.tp_bytes = int(2 * act * layers_per_chunk)
        self.cp_bytes = int(
            2 * tokens * spec.kv_dim * BYTES_PER_ELEM * lay.cp * layers_per_chunk / lay.tp
        )
        self.ep_bytes = int(act * spec.topk * layers_per_chunk / lay.tp)
        self.p2p_bytes = act
        stage_params = self.layers_per_stage * (
            spec.attn_params_per_layer + spec.experts * spec.expert_params_per_layer / lay.ep
        )
        self.dp_bytes = int(stage_params / lay.tp * BYTES_PER_ELEM)
        # HSDP: after the shard group's reduce-scatter, each replica all-reduces its shard.
        self.dpr_bytes = int(self.dp_bytes / lay.dp_shard)
        # Optimizer step: memory bound, ~16 bytes of state touched per parameter per dp shard.
        self.t_opt_us = stage_params / lay.tp / lay.dp_shard * 16 / hw.hbm_bw * 1e6
        m = lay.microbatches
        self.est_iter_us = (m + lay.pp - 1) * (self.t_fwd_us + self.t_bwd_us) + self.t_opt_us

    def _comm_pairs(self) -> list[tuple[str, str]]:
        """The ``(op, group_kind)`` pairs whose transfer times this job draws: what a
        :class:`~holmes_ml.simulator.calibrate.Calibration` can set (recv shares send's)."""
        lay = self.lay
        pairs = [("all_reduce", "tp")] if lay.tp > 1 else []
        pairs += [("all_gather", "cp"), ("reduce_scatter", "cp")] if lay.cp > 1 else []
        pairs += [("all_to_all", "ep")] if lay.ep > 1 else []
        pairs += [("send", "pp")] if lay.pp > 1 else []
        pairs += [("reduce_scatter", "dp"), ("all_gather", "dp")] if lay.dp_shard > 1 else []
        pairs += [("all_reduce", "dp_replicate")] if lay.dp_replicate > 1 else []
        return pairs

    def _check_calibration(self, cal: Calibration) -> None:
        """Say which of the job's transfers the calibration sets; refuse one that sets nothing.

        A log whose group kinds are not the job's (a Kineto trace names process groups '0',
        'default', not tp/dp/pp) calibrated no communication at all, silently, while the
        compute-scale warning spoke as if it had.
        """
        pairs = self._comm_pairs()
        used = [p for p in pairs if cal.get(*p) is not None]
        if used:
            rest = [p for p in pairs if p not in used]
            if rest:
                logger.info("calibration from %s: %s not in the log, at the built-in model",
                            cal.source, _pairs(rest))
            return
        kinds = sorted({k for _, k in cal.table} - {"tp", "cp", "ep", "dp", "pp", "dp_replicate"})
        why = (f" (its group kinds {', '.join(map(repr, kinds))} are no parallel dimension: "
               "a trace names process groups, not tp/cp/ep/dp/pp)" if kinds else "")
        said = (f"none of the (op, group_kind) pairs fitted from {cal.source} "
                f"({_pairs(sorted(cal.table)) or 'none: too few rows of each'}) is one this "
                f"job runs ({_pairs(pairs)}){why}")
        if not cal.iteration_us:
            raise ValueError(f"calibrate_from: {said}, and it has no iteration and start_ns "
                             "to time iterations by, so it would calibrate nothing; expected "
                             "a CommOps log whose group_kind (or group name prefix) is tp, cp, "
                             "ep, dp, pp or dp_replicate")
        logger.warning("calibration: %s; communication stays at the built-in alpha-beta "
                       "model (jitter %g); only compute is calibrated, to the log's iteration "
                       "time (%.0f us)", said, self.cfg.jitter, cal.iteration_us)

    def _fit_compute_scale(self, target_us: float) -> float:
        """Compute-time factor whose healthy iteration time matches ``target_us``.

        Iteration time is affine in the compute factor (comm on the critical path is the
        intercept), so two short fault-free probe runs give the factor by a secant step.
        """
        probe = replace(self.cfg, faults=(), iterations=3, drift=0.0, calibrate_from=None)

        def iter_time(factor: float) -> float:
            eng = Engine(probe, calibration=self.calibration, compute_scale=factor)
            return float(np.median([iteration_span_us(f) for f in list(eng.iterations())[1:]]))

        f1 = target_us / self.est_iter_us
        f2 = 0.5 * f1
        t1, t2 = iter_time(f1), iter_time(f2)
        slope = (t1 - t2) / (f1 - f2)
        factor = f2 + (target_us - t2) / slope if slope > 0 else f1
        if factor < 0.01:
            logger.warning(
                "calibration: the log's iteration time %.0f us is shorter than the simulated "
                "job's communication alone; compute scaled to 1%% of the model",
                target_us,
            )
        return max(0.01, factor)

    def _topological_1f1b(self) -> list[tuple[int, str, int]]:
        """Global order of (stage, 'F'|'B', microbatch) that respects pipeline dependencies."""
        pp, m = self.lay.pp, self.lay.microbatches
        per_stage: list[list[tuple[str, int]]] = []
        for s in range(pp):
            warm = min(pp - s - 1, m)
            seq = [("F", i) for i in range(warm)]
            for i in range(m - warm):
                seq += [("F", warm + i), ("B", i)]
            seq += [("B", i) for i in range(m - warm, m)]
            per_stage.append(seq)
        done: set[tuple[int, str, int]] = set()
        ptr = [0] * pp
        order: list[tuple[int, str, int]] = []
        total = sum(len(x) for x in per_stage)
        while len(order) < total:
            progressed = False
            for s in range(pp):
                while ptr[s] < len(per_stage[s]):
                    kind, i = per_stage[s][ptr[s]]
                    dep = (s - 1, "F", i) if kind == "F" else (s + 1, "B", i)
                    ok = (kind == "F" and s == 0) or (kind == "B" and s == pp - 1) or dep in done
                    if not ok:
                        break
                    done.add((s, kind, i))
                    order.append((s, kind, i))
                    ptr[s] += 1
                    progressed = True
            if not progressed:  # pragma: no cover - the 1F1B schedule is acyclic
                raise RuntimeError("1F1B schedule deadlocked")
        return order

    def _categories(self) -> None:
        cl = self.cluster
        self.group_cat = pd.Index(cl.names)
        gr = np.asarray(cl.group_ranks_str, dtype=object)
        uniq, inv = np.unique(gr.astype(str), return_inverse=True)
        self.gr_cat = pd.Index(uniq)
        self.gr_code = inv.astype(np.int32)
        kinds = np.asarray(cl.kinds, dtype=object).astype(str)
        kuniq, kinv = np.unique(kinds, return_inverse=True)
        self.kind_cat = pd.Index(kuniq)
        self.kind_code = kinv.astype(np.int8)
        self.host_cat = pd.Index(cl.host_names.astype(str))
        self.host_code = cl.host_idx.astype(np.int32)
        self.stage_ranks = [cl.rank_grid[s].ravel() for s in range(self.lay.pp)]

    # ----------------------------------------------------------------- per-iteration state
    def _transfer(self, fam: Family, op: str, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """Fault-free latency and bandwidth parts of the transfer time per group instance
        (inst_shape), microseconds."""
        p = 2 if fam.axis is None else fam.members.shape[1]
        steps, factor = _ALGO["send" if op in ("send", "recv") else op]
        hw = self.hw
        alpha = np.where(fam.inter, hw.alpha_inter_us, hw.alpha_intra_us) * steps(p)
        bw = np.where(fam.inter, hw.nic_bw, hw.nvlink_bw)
        return alpha, factor(p) * nbytes / bw * 1e6

    def _scenarios(self, i: int) -> tuple[int, ...]:
        """Scenarios fault ``i`` acts in: the job's, and its own when there are several."""
        return (0, 2 + i) if self.S > 2 else (0,)

    def _solo(self, values: np.ndarray) -> np.ndarray | None:
        """Each fault-alone scenario's values of a (scenario, ...) array, one row per fault."""
        return values[2:].reshape(self.S - 2, -1) if self.S > 2 else None

    def _bw_mult(self, key: tuple[str, int], it: int, inst_shape: tuple[int, ...]) -> np.ndarray:
        mult = np.ones((self.S, *inst_shape))
        flat = mult.reshape(self.S, -1)
        for i, f in enumerate(self.faults):
            if f.spec.kind in BANDWIDTH_KINDS and f.active[it] and key in f.slowed:
                for sc in self._scenarios(i):
                    flat[sc, f.slowed[key]] *= 1.0 + f.spec.severity
        return mult

    def _touch_ids(
        self, key: tuple[str, int], it: int, full_shape: tuple[int, ...]
    ) -> np.ndarray | None:
        if not self.faults:
            return None
        fid = np.full(full_shape, -1, dtype=np.int16)
        hit = False
        for i in self._by_severity:
            f = self.faults[i]
            if f.active[it] and key in f.touch:
                fid[np.broadcast_to(f.touch[key], full_shape)] = i
                hit = True
        return fid.ravel() if hit else None

    def _next_seq(self, key: tuple[str, int]) -> int:
        v = self._seq.get(key, 0)
        self._seq[key] = v + 1
        return v

    def _xfer_time(
        self, op: str, kind: str, alpha: np.ndarray, beta: np.ndarray, bwm: np.ndarray
    ) -> np.ndarray:
        shape = alpha.shape
        cal = self.calibration.get(op, kind) if self.calibration is not None else None
        if cal is not None:
            noise = np.exp(cal.sigma * self.rng.standard_normal(shape))
            model = alpha + beta
            # Median matches the log; intra/inter-host and fault ratios come from the model.
            scale = cal.median_us / float(np.median(model))
            return scale * (alpha + beta * bwm) * noise * self._xfer_drift
        noise = np.exp(self.cfg.jitter * self.rng.standard_normal(shape))
        return (alpha + beta * bwm) * noise * self._xfer_drift

    # ----------------------------------------------------------------- op steps
    def _collective(
        self, s: int, kind: str, op: str, nbytes: int, it: int, out: list[_Chunk]
    ) -> None:
        key = (kind, s)
        fam = self.cluster.families.get(key)
        if fam is None:
            return
        arr = self.clock[s]
        # HSDP families act on a finer view of the same stage array (same flat order).
        shape = fam.grid_shape or self.stage_shape
        view = arr.reshape(self.S, *shape)
        axis = fam.axis + 1  # type: ignore[operator]
        last = view.max(axis=axis, keepdims=True)
        alpha, beta = self._transfer(fam, op, nbytes)
        cal_kind = "dp_replicate" if kind == "dpr" else kind
        xfer = self._xfer_time(op, cal_kind, alpha, beta, self._bw_mult(key, it, fam.inst_shape))
        complete = last + xfer
        dur = complete - view
        out.append(
            _Chunk(
                self.stage_ranks[s],
                _OP_CODE[op],
                fam.gid.ravel(),
                self._next_seq(key),
                nbytes,
                arr[0].ravel().copy(),
                dur[0].ravel(),
                dur[1].ravel() if self.S >= 2 else None,
                None,
                self._touch_ids(key, it, shape),
                self._solo(dur),
            )
        )
        self.clock[s] = np.broadcast_to(complete, view.shape).reshape(arr.shape).copy()

    def _send(self, s: int, kind: str, m: int, it: int, out: list[_Chunk]) -> None:
        """Stage ``s`` sends on hop family ``(kind, hop)`` (ppf: to s+1, ppb: to s-1)."""
        hop = s if kind == "ppf" else s - 1
        key = (kind, hop)
        fam = self.cluster.families[key]
        alpha, beta = self._transfer(fam, "send", self.p2p_bytes)
        xfer = self._xfer_time("send", "pp", alpha, beta, self._bw_mult(key, it, fam.inst_shape))
        start = self.clock[s].copy()
        self._pending[(kind, hop, m)] = (start, xfer)
        dst = hop + 1 if kind == "ppf" else hop
        out.append(
            _Chunk(
                self.stage_ranks[s],
                _OP_CODE["send"],
                fam.gid.ravel(),
                self._next_seq((kind + "s", hop)),
                self.p2p_bytes,
                start[0].ravel().copy(),
                xfer[0].ravel(),
                xfer[1].ravel() if self.S >= 2 else None,
                self.stage_ranks[dst],
                self._touch_ids(key, it, self.stage_shape),
                self._solo(xfer),
            )
        )
        self.clock[s] = start + xfer

    def _recv(self, s: int, kind: str, m: int, it: int, out: list[_Chunk]) -> None:
        hop = s - 1 if kind == "ppf" else s
        key = (kind, hop)
        fam = self.cluster.families[key]
        send_start, xfer = self._pending.pop((kind, hop, m))
        arr = self.clock[s]
        complete = np.maximum(arr, send_start) + xfer
        dur = complete - arr
        src = hop if kind == "ppf" else hop + 1
        out.append(
            _Chunk(
                self.stage_ranks[s],
                _OP_CODE["recv"],
                fam.gid.ravel(),
                self._next_seq((kind + "r", hop)),
                self.p2p_bytes,
                arr[0].ravel().copy(),
                dur[0].ravel(),
                dur[1].ravel() if self.S >= 2 else None,
                self.stage_ranks[src],
                self._touch_ids(key, it, self.stage_shape),
                self._solo(dur),
            )
        )
        self.clock[s] = complete

    def _compute(self, s: int, base_us: float) -> None:
        noise = np.exp(self.cfg.jitter * self.rng.standard_normal(self.stage_shape))
        took = base_us * noise * self._comp_mult[s]
        self.clock[s] = self.clock[s] + took
        if self._computed is not None:  # only when the job logs compute times
            self._computed[s] += took

    # ----------------------------------------------------------------- iteration
    def _prepare_iteration(self, it: int) -> None:
        cfg = self.cfg
        drift = 1.0 + cfg.drift * it / max(1, cfg.iterations - 1)
        self._xfer_drift = 1.0 + cfg.comm_drift * it / max(1, cfg.iterations - 1)
        mult = np.full((self.S, self.cluster.world), drift)
        # workload (both the job and its twin): uneven stages, per-step sequence lengths
        if cfg.stage_weights:
            mult *= np.asarray(cfg.stage_weights, dtype=np.float64)[self.cluster.coords[:, 0]]
        if cfg.seq_imbalance > 0:
            heavier = 1.0 + cfg.seq_imbalance * self._seq_rng.random(self.lay.dp)
            mult *= heavier[self.cluster.coords[:, 1]]
        self._computed: list[np.ndarray] | None = (
            [np.zeros((self.S, *self.stage_shape)) for _ in range(self.lay.pp)]
            if cfg.log_compute else None)
        # (microbatch, rank, pause_us, scenario)
        self._stalls: list[tuple[int, int, float, int]] = []
        for i, f in enumerate(self.faults):
            if not f.active[it]:
                continue
            if f.spec.kind == "gpu_slow":
                for sc in self._scenarios(i):
                    mult[sc, f.ranks] *= 1.0 + f.spec.severity
            elif f.spec.kind == "host_stall":
                pause = f.spec.severity * self.est_iter_us
                m = f.stall_microbatch.get(it, 0)
                self._stalls.extend((m, int(r), pause, sc) for r in f.ranks
                                    for sc in self._scenarios(i))
        self._comp_mult = [
            mult[:, self.stage_ranks[s]].reshape(self.S, *self.stage_shape)
            for s in range(self.lay.pp)
        ]

    def _apply_stalls(self, s: int, m: int) -> None:
        for mb, rank, pause, sc in self._stalls:
            if mb != m:
                continue
            coords = self.cluster.coords[rank]
            if coords[0] != s:
                continue
            self.clock[s][(sc, *coords[1:])] += pause

    def _forward(self, s: int, m: int, it: int, out: list[_Chunk]) -> None:
        lay = self.lay
        if s > 0:
            self._recv(s, "ppf", m, it, out)
        self._apply_stalls(s, m)
        for _ in range(self.chunks):
            self._compute(s, self.t_fwd_us / self.chunks)
            if lay.cp > 1:
                self._collective(s, "cp", "all_gather", self.cp_bytes, it, out)
            if lay.ep > 1:
                self._collective(s, "ep", "all_to_all", self.ep_bytes, it, out)
                self._collective(s, "ep", "all_to_all", self.ep_bytes, it, out)
            if lay.tp > 1:
                self._collective(s, "tp", "all_reduce", self.tp_bytes, it, out)
        if s < lay.pp - 1:
            self._send(s, "ppf", m, it, out)

    def _backward(self, s: int, m: int, it: int, out: list[_Chunk]) -> None:
        lay = self.lay
        if s < lay.pp - 1:
            self._recv(s, "ppb", m, it, out)
        for _ in range(self.chunks):
            self._compute(s, self.t_bwd_us / self.chunks)
            if lay.ep > 1:
                self._collective(s, "ep", "all_to_all", self.ep_bytes, it, out)
                self._collective(s, "ep", "all_to_all", self.ep_bytes, it, out)
            if lay.cp > 1:
                self._collective(s, "cp", "reduce_scatter", self.cp_bytes, it, out)
            if lay.tp > 1:
                self._collective(s, "tp", "all_reduce", self.tp_bytes, it, out)
        if s > 0:
            self._send(s, "ppb", m, it, out)

    def _optimizer(self, s: int, it: int, out: list[_Chunk]) -> None:
        # Distributed optimizer: reduce-scatter gradients, step on the shard, all-gather params.
        # HSDP: the shard group is one replica's dp_shard ranks, and the gradient shard is
        # all-reduced across the replicas before the step.
        if self.lay.dp_shard > 1:
            self._collective(s, "dp", "reduce_scatter", self.dp_bytes, it, out)
        if self.lay.dp_replicate > 1:
            self._collective(s, "dpr", "all_reduce", self.dpr_bytes, it, out)
        self._compute(s, self.t_opt_us)
        if self.lay.dp_shard > 1:
            self._collective(s, "dp", "all_gather", self.dp_bytes, it, out)

    def run_iteration(self, it: int) -> pd.DataFrame:
        """Simulate iteration ``it`` (iterations must be run in order) and return its rows."""
        self._prepare_iteration(it)
        self._pending: dict = {}
        out: list[_Chunk] = []
        for s, kind, m in self._schedule:
            if kind == "F":
                self._forward(s, m, it, out)
            else:
                self._backward(s, m, it, out)
        for s in range(self.lay.pp):
            self._optimizer(s, it, out)
        return self._frame(it, out)

    def iterations(self, progress: bool = False) -> Iterator[pd.DataFrame]:
        """Yield one ops DataFrame per iteration."""
        self.clock = [np.zeros((self.S, *self.stage_shape)) for _ in range(self.lay.pp)]
        self._seq = {}
        self._by_severity = sorted(
            range(len(self.faults)), key=lambda i: self.faults[i].spec.severity
        )
        its = range(self.cfg.iterations)
        if progress:
            from tqdm.auto import tqdm

            its = tqdm(its, desc="simulate", unit="it")
        for it in its:
            yield self.run_iteration(it)

    # ----------------------------------------------------------------- rows
    def _frame(self, it: int, out: list[_Chunk]) -> pd.DataFrame:
        sizes = np.fromiter((len(c.ranks) for c in out), dtype=np.int64, count=len(out))
        n = int(sizes.sum())
        rank = np.concatenate([c.ranks for c in out]).astype(np.int64)
        gid = np.concatenate([c.gid for c in out])
        op = np.repeat(np.fromiter((c.op for c in out), np.int8, len(out)), sizes)
        seq = np.repeat(np.fromiter((c.seq for c in out), np.int64, len(out)), sizes)
        nbytes = np.repeat(np.fromiter((c.nbytes for c in out), np.int64, len(out)), sizes)
        start = np.concatenate([c.start for c in out])
        dur = np.concatenate([c.dur for c in out])
        peer = np.concatenate(
            [c.peer if c.peer is not None else np.full(len(c.ranks), -1) for c in out]
        ).astype(np.int64)
        abnormal = np.zeros(n, dtype=bool)
        affected = abnormal
        fault_id = np.full(n, -1, dtype=np.int64)
        if self.S >= 2:
            dur0 = np.concatenate([c.dur0 for c in out])  # type: ignore[misc]
            affected = dur > dur0 * (1.0 + ABNORMAL_REL) + ABNORMAL_ABS_US
            usual = np.repeat(np.fromiter((_usual_ceiling(c.dur0) for c in out), np.float64,
                                          len(out)), sizes)
            abnormal = affected & (dur > usual)
            fid = np.concatenate(
                [c.fid if c.fid is not None else np.full(len(c.ranks), -1, np.int16) for c in out]
            ).astype(np.int64)
            fallback = self._fallback_fault(it)
            blamed = np.where(fid >= 0, fid, fallback)
            if self.S > 2:
                # the fault that alone delays the op most; severities of different kinds (a
                # GPU's 0.8, a NIC's 2) are different scales, so comparing them blamed a NIC
                # for waits that propagated from a slow GPU two pipeline stages away
                delay = np.concatenate([c.solo for c in out], axis=1)  # type: ignore[misc]
                delay -= dur0
                most = delay.argmax(axis=0)
                reached = np.take_along_axis(delay, most[None], axis=0)[0] > 0
                blamed = np.where(reached, most, blamed)
            fault_id = np.where(abnormal, blamed, -1)
        start_ns = EPOCH_NS + np.round(start * 1000.0).astype(np.int64)
        extra = {}
        if self._computed is not None:
            per_rank = np.zeros(self.cluster.world)
            # scenario 1 when faulted, 0 when healthy: the column as it always was (the last of
            # job and twin). NB: that is the fault-free twin's compute, so a slow GPU's longer
            # compute does not show in it
            logged = min(1, self.S - 1)
            for s in range(self.lay.pp):  # in rank_grid order
                per_rank[self.stage_ranks[s]] = self._computed[s][logged].ravel()
            extra["step_compute_us"] = per_rank[rank]
        cat = pd.Categorical.from_codes
        frame = pd.DataFrame(
            {
                "iteration": np.full(n, it, dtype=np.int64),
                "rank": rank,
                "op": cat(op, categories=pd.Index(OPS)),
                "group": cat(gid, categories=self.group_cat),
                "seq": seq,
                "nbytes": nbytes,
                "start_ns": start_ns,
                "duration_us": dur.astype(np.float64),
                "group_ranks": cat(self.gr_code[gid], categories=self.gr_cat),
                "peer": peer,
                "host": cat(self.host_code[rank], categories=self.host_cat),
                "group_kind": cat(self.kind_code[gid], categories=self.kind_cat),
                "job": cat(np.zeros(n, dtype=np.int8), categories=pd.Index([self.cfg.job])),
                "abnormal": abnormal,
                "fault_id": fault_id,
                "affected": affected,
                **extra,
            }
        )
        return frame

    def _fallback_fault(self, it: int) -> int:
        """Fault blamed for an abnormal op whose group the faults do not touch directly."""
        best = -1
        for i in self._by_severity:
            if self.faults[i].active[: it + 1].any():
                best = i
        active = [i for i in self._by_severity if self.faults[i].active[it]]
        return active[-1] if active else best
