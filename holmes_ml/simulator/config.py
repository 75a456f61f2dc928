"""What to simulate: the job (:class:`SimConfig`) and the faults injected (:class:`FaultSpec`).

Both are frozen dataclasses validated on construction, so a bad value fails where it is written,
with a message naming the field, the value and what was expected.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from holmes_ml.simulator.models import DEFAULT_TP_PP, HARDWARE, MODELS

FAULT_KINDS: tuple[str, ...] = (
    "gpu_slow",
    "nic_slow",
    "link_slow",
    "switch_congested",
    "host_stall",
)
PATTERNS: tuple[str, ...] = ("spike", "fluctuation", "persistent")
#: Bounds of a simulated job: a fault at most this many times slower (an infinite or absurd
#: one overflows the simulated clock), at most this many GPUs and iterations (memory, hours).
MAX_SEVERITY = 1000.0
MAX_GPUS = 32_768
MAX_ITERATIONS = 100_000
#: Device-id prefix each fault kind acts on.
DEVICE_PREFIX: dict[str, str] = {
    "gpu_slow": "gpu:",
    "nic_slow": "nic:",
    "link_slow": "link:",
    "switch_congested": "switch:",
    "host_stall": "host:",
}
_PARSE_KEYS = ("rank", "ranks", "device", "pattern", "severity", "start", "end", "probability")


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault.

    Parameters
    ----------
    kind:
        ``gpu_slow`` (compute of a rank slower), ``nic_slow`` / ``link_slow`` (bandwidth cut on the
        flows crossing that NIC / leaf-spine cable), ``switch_congested`` (every flow through a
        switch), ``host_stall`` (a pause of one rank, e.g. a dataloader or CPU hiccup).
    ranks:
        For gpu/nic/host faults the rank whose device is faulty (empty: one is drawn with the
        seed). For link/switch faults a rank below the device used to pick it; once resolved,
        the ranks whose traffic crosses the device.
    device:
        Explicit device id (``nic:node003/5``, ``link:leaf-p0-r3~spine-1``, ``switch:spine-0``).
        A link or switch fault's device overrides ``ranks`` for choosing it; a GPU, NIC or host
        fault given both must name the same device with them (else it is refused).
    pattern:
        ``persistent`` (every iteration from start to end), ``spike`` (1-2 iterations unless
        ``end_iteration`` is given), ``fluctuation`` (each iteration active with ``probability``).
    severity:
        Slowdown factor minus one: 0.5 = compute 1.5x slower or bandwidth / 1.5. For
        ``host_stall``: pause length as a fraction of the (healthy) iteration time.
    start_iteration, end_iteration:
        Onset and last iteration (inclusive; ``None`` = to the end of the run).
    probability:
        Chance a ``fluctuation`` fault is active in a given iteration.
    hosts, links, devices, active_iterations:
        Filled in by the simulator when it resolves the fault (see :meth:`to_dict`).

    Examples
    --------
    >>> FaultSpec.parse("gpu_slow:rank=5,severity=0.5,start=5").ranks
    (5,)
    """

    kind: str
    ranks: tuple[int, ...] = ()
    device: str | None = None
    pattern: str = "persistent"
    severity: float = 0.5
    start_iteration: int = 0
    end_iteration: int | None = None
    probability: float = 0.5
    hosts: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    active_iterations: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(
                f"FaultSpec.kind: got {self.kind!r}; expected one of {', '.join(FAULT_KINDS)}"
            )
        if self.pattern not in PATTERNS:
            raise ValueError(
                f"FaultSpec.pattern: got {self.pattern!r}; expected one of {', '.join(PATTERNS)}"
            )
        # ("12" was ranks 1 and 2, 1.7 rank 1, and 5 failed as "'int' object is not iterable")
        ranks = _sequence(self.ranks, "FaultSpec.ranks", "a tuple of ranks, e.g. "
                          f"({self.ranks if _is_int(self.ranks) else 5},), or () to draw one")
        if not all(map(_is_int, ranks)):
            raise ValueError(f"FaultSpec.ranks: got {self.ranks!r}; expected a tuple of "
                             "integer ranks")
        object.__setattr__(self, "ranks", tuple(int(r) for r in ranks))
        for name in ("severity", "probability"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"FaultSpec.{name}: got {getattr(self, name)!r}; expected a "
                                 "number")
        for name in ("start_iteration", "end_iteration"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise ValueError(f"FaultSpec.{name}: got {value!r}; expected an integer "
                                 "iteration")
            if value is not None:
                object.__setattr__(self, name, int(value))
        if self.device is not None and not isinstance(self.device, str):
            raise ValueError(f"FaultSpec.device: got {self.device!r}; expected a device id "
                             "such as gpu:node000/3, or None")
        if any(r < 0 for r in self.ranks):
            raise ValueError(f"FaultSpec.ranks: got {self.ranks!r}; expected ranks >= 0")
        if not (0 < self.severity <= MAX_SEVERITY):
            # (inf, or 1e12, overflowed the simulated clock: logs its own reader refuses)
            raise ValueError(f"FaultSpec.severity: got {self.severity!r}; expected a number > 0 "
                             f"and at most {MAX_SEVERITY:g}")
        if self.start_iteration < 0:
            raise ValueError(
                f"FaultSpec.start_iteration: got {self.start_iteration!r}; expected >= 0"
            )
        if self.end_iteration is not None and self.end_iteration < self.start_iteration:
            raise ValueError(
                f"FaultSpec.end_iteration: got {self.end_iteration!r}; expected >= start_iteration "
                f"({self.start_iteration}) or None"
            )
        if not (0 < self.probability <= 1):
            raise ValueError(
                f"FaultSpec.probability: got {self.probability!r}; expected 0 < p <= 1"
            )
        if self.device is not None:
            prefix = DEVICE_PREFIX[self.kind]
            if not self.device.startswith(prefix):
                raise ValueError(
                    f"FaultSpec.device: got {self.device!r} for a {self.kind} fault; "
                    "expected a device "
                    f"id starting with {prefix!r}"
                )

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parse ``KIND[:key=value,...]`` (the CLI's ``--fault``).

        Keys: ``rank`` / ``ranks`` (``3+4`` for several), ``device``, ``pattern``, ``severity``,
        ``start``, ``end``, ``probability``.

        Examples
        --------
        >>> f = FaultSpec.parse("nic_slow:ranks=3+4,pattern=spike,severity=2,start=4")
        >>> (f.kind, f.ranks, f.pattern, f.severity, f.start_iteration)
        ('nic_slow', (3, 4), 'spike', 2.0, 4)
        """
        kind, _, rest = text.strip().partition(":")
        kind = kind.strip()
        if kind not in FAULT_KINDS:
            raise ValueError(
                f"fault {text!r}: unknown kind {kind!r}; expected one of {', '.join(FAULT_KINDS)} "
                "(syntax KIND[:key=value,...])"
            )
        kwargs: dict = {"kind": kind}
        given: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or key not in _PARSE_KEYS:
                raise ValueError(
                    f"fault {text!r}: bad key {key!r}"
                    + ("" if eq else " (missing '=value')")
                    + f"; expected key=value with key one of {', '.join(_PARSE_KEYS)}"
                )
            same = "ranks" if key in ("rank", "ranks") else key
            if same in given:  # the last one silently won
                raise ValueError(f"fault {text!r}: {key!r} given twice (after {given[same]!r}); "
                                 "expected each key once (ranks=3+4 for several ranks)")
            given[same] = item
            try:
                if key in ("rank", "ranks"):
                    kwargs["ranks"] = tuple(int(v) for v in value.split("+"))
                elif key == "device":
                    kwargs["device"] = value
                elif key == "pattern":
                    kwargs["pattern"] = value
                elif key in ("severity", "probability"):
                    kwargs[key] = float(value)
                elif key == "start":
                    kwargs["start_iteration"] = int(value)
                elif key == "end":
                    kwargs["end_iteration"] = None if value.lower() in ("", "none") else int(value)
            except ValueError as exc:
                raise ValueError(
                    f"fault {text!r}: bad value {value!r} for key {key!r} ({exc})"
                ) from exc
        if "probability" in given and kwargs.get("pattern", "persistent") != "fluctuation":
            # ignored by the other patterns, while faults.json kept it
            raise ValueError(f"fault {text!r}: probability applies to pattern=fluctuation "
                             f"only; got pattern={kwargs.get('pattern', 'persistent')}")
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"fault {text!r}: {exc}") from exc

    def to_dict(self) -> dict:
        """The ``faults.json`` entry."""
        return {
            "kind": self.kind,
            "device": self.device,
            "ranks": list(self.ranks),
            "hosts": list(self.hosts),
            "links": list(self.links),
            "devices": list(self.devices),
            "start_iteration": self.start_iteration,
            "end_iteration": self.end_iteration,
            "pattern": self.pattern,
            "severity": self.severity,
            "probability": self.probability,
            "active_iterations": None
            if self.active_iterations is None
            else list(self.active_iterations),
        }

    @classmethod
    def from_dict(cls, data: dict) -> FaultSpec:
        """Inverse of :meth:`to_dict` (unknown keys are ignored, so older files still load)."""
        act = data.get("active_iterations")
        devices = data.get("devices") or []
        # to_dict writes "device" (None for a fault on several devices, e.g. ranks=3+4); only
        # a file without the key takes it from a single resolved device. Taking the first of
        # several pinned the fault to ranks 3+4 *and* device 3, which simulate refused
        device = data["device"] if "device" in data else (
            devices[0] if len(devices) == 1 else None)
        return cls(
            kind=data["kind"],
            ranks=tuple(data.get("ranks", ())),
            device=device,
            pattern=data.get("pattern", "persistent"),
            severity=float(data.get("severity", 0.5)),
            start_iteration=int(data.get("start_iteration", 0)),
            end_iteration=data.get("end_iteration"),
            probability=float(data.get("probability", 0.5)),
            hosts=tuple(data.get("hosts", ())),
            links=tuple(data.get("links", ())),
            devices=tuple(data.get("devices", ())),
            active_iterations=None if act is None else tuple(int(i) for i in act),
        )


@dataclass(frozen=True)
class Layout:
    """Resolved parallel sizes; world = tp * cp * ep * dp * pp."""

    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    microbatches: int
    #: Replicas of the sharded data-parallel group (HSDP); ``dp = dp_replicate * dp_shard``.
    dp_replicate: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.ep * self.dp * self.pp

    @property
    def dp_shard(self) -> int:
        """Ranks sharing one copy of the optimizer state (the whole ``dp`` group without HSDP)."""
        return self.dp // self.dp_replicate

    def as_dict(self) -> dict[str, int]:
        out = {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp, "pp": self.pp}
        if self.dp_replicate > 1:
            out["dp_replicate"] = self.dp_replicate
        return out


@dataclass(frozen=True)
class SimConfig:
    """A simulated training job.

    Parameters
    ----------
    gpus:
        World size (8 GPUs per host; more than 8 must be a multiple of 8).
    model:
        One of :data:`holmes_ml.simulator.MODELS`.
    tp, pp, dp, ep, cp:
        Parallel sizes; ``None`` picks a sensible default for the model and fills ``dp`` with the
        rest. Rank order is Megatron's ``tp-cp-ep-dp-pp`` (tp fastest, pp slowest).
    dp_replicate:
        Hybrid sharded data parallelism (HSDP, the sixth dimension): the ``dp`` ranks split into
        ``dp_replicate`` replicas of ``dp // dp_replicate`` shard ranks (shard index fastest).
        Gradients are reduce-scattered and parameters all-gathered inside a shard group
        (group kind ``dp``) and the gradient shard is all-reduced across the replicas (group
        kind ``dp_replicate``). 1 (default): one distributed-optimizer group over all of ``dp``.
    iterations:
        Training iterations to simulate.
    microbatches:
        Microbatches per iteration per pipeline (1F1B schedule); ``None`` = ``max(pp, 4)``.
    faults:
        Faults to inject (empty = healthy run).
    seed:
        Seeds every random draw (jitter, drift phase, fault placement and activity).
    jitter:
        Sigma of the log-normal noise on every compute and transfer time.
    drift:
        Relative growth of compute time over the run (0.1 = the last iteration computes 10%
        slower than the first, linearly), shared by the whole job, as thermal throttling or
        growing data-dependent work would cause. Benign: it never produces ``abnormal`` labels.
    comm_drift:
        The same for every communication transfer time (0.2 = the last iteration's transfers
        take 20% longer, linearly): throttled GPUs run NCCL kernels slower too, and fabric load
        grows. Benign like ``drift``; with both set, every time the logs show drifts and a
        detector keyed on absolute microseconds needs its thresholds moved.
    stage_weights:
        Workload, not a fault: each pipeline stage's compute time as a multiple of the model's
        even split, one weight per stage (``(1, 1, 1, 1.4)``: the last stage holds 40 % more
        work, as an uneven layer partition or a heavy loss head gives); ``()`` = balanced.
        Both the job and its fault-free twin carry it, so it never produces ``abnormal``
        labels: a localizer should name it as a workload cause, not a device.
    seq_imbalance:
        Workload, not a fault: at every step each data-parallel replica computes
        ``1 + seq_imbalance * u`` times as long, ``u`` uniform in [0, 1) drawn per step and
        replica (the sequences of a step differ in length between data-parallel ranks); the
        slowest replica changes from step to step. Drawn from its own random stream, so every
        other draw (jitter, fault placement) is as without it. Benign like ``stage_weights``.
    log_compute:
        Add the column ``step_compute_us``: each rank's compute time in the step (what the
        ByteDance what-if traces record; host pauses are not compute).
    calibrate_from:
        A log in any format :func:`holmes_ml.io.read_ops` reads (canonical CommOps, Kineto,
        Flight Recorder, ...) whose per-(op, group_kind) durations replace the model's scale and
        ``jitter`` for the communication of those pairs this job runs (a trace whose group
        kinds are process-group names matches none: a warning says so), and whose iteration
        time rescales compute (see :mod:`holmes_ml.simulator.calibrate`).
    hardware:
        ``a100`` or ``h100`` (see :data:`holmes_ml.simulator.models.HARDWARE`).
    hosts_per_pod, spines:
        Fabric: hosts below one set of rail leaves, and spine switches above the leaves.
        ``hosts_per_pod=None`` uses 32 hosts per pod, but at least 4 pods for jobs under
        128 hosts, so that small simulated jobs still cross leaf-spine links (see
        :attr:`pod_hosts`).
    micro_batch_size:
        Sequences per microbatch.
    job:
        Value of the ``job`` column.
    """

    gpus: int = 128
    model: str = "llama2-13b"
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int = 1
    cp: int = 1
    iterations: int = 30
    microbatches: int | None = None
    faults: tuple[FaultSpec, ...] = ()
    seed: int = 0
    jitter: float = 0.03
    drift: float = 0.0
    calibrate_from: str | Path | None = None
    hardware: str = "a100"
    hosts_per_pod: int | None = None
    spines: int = 8
    micro_batch_size: int = 1
    job: str = "sim"
    dp_replicate: int = 1
    comm_drift: float = 0.0
    stage_weights: tuple[float, ...] = ()
    seq_imbalance: float = 0.0
    log_compute: bool = False
    _layout: Layout | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        faults = self.faults
        if isinstance(faults, FaultSpec):  # one fault, not a tuple of them
            raise ValueError(f"SimConfig.faults: got one FaultSpec ({faults.kind}); expected a "
                             "tuple of them, e.g. faults=(spec,)")
        object.__setattr__(self, "faults", _sequence(
            faults, "SimConfig.faults",
            "a tuple of FaultSpec, e.g. (FaultSpec.parse('gpu_slow:rank=5'),), or () for a "
            "healthy run"))
        if self.model not in MODELS:
            raise ValueError(
                f"SimConfig.model: got {self.model!r}; expected one of {', '.join(MODELS)}"
            )
        if self.hardware not in HARDWARE:
            raise ValueError(
                f"SimConfig.hardware: got {self.hardware!r}; expected one of {', '.join(HARDWARE)}"
            )
        # (gpus 0 said ">= 1", and then gpus 1 "at least 2")
        if not _is_int(self.gpus) or self.gpus < 2:
            raise ValueError(f"SimConfig.gpus: got {self.gpus!r}; expected an integer of at "
                             "least 2 (a rank alone runs no collective and has no peer to "
                             "compare with)")
        for name in (
            "gpus", "iterations", "ep", "cp", "dp_replicate", "spines", "micro_batch_size"
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"SimConfig.{name}: got {value!r}; expected an integer >= 1")
            object.__setattr__(self, name, int(value))  # (a numpy integer too)
        for name in ("tp", "pp", "dp", "microbatches", "hosts_per_pod"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(
                    f"SimConfig.{name}: got {value!r}; expected an integer >= 1 or None"
                )
            if value is not None:
                object.__setattr__(self, name, int(value))
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"SimConfig.seed: got {self.seed!r}; expected an integer >= 0")
        object.__setattr__(self, "seed", int(self.seed))
        if not isinstance(self.job, str) or not self.job.strip():
            raise ValueError(f"SimConfig.job: got {self.job!r}; expected a non-empty name")
        for name, most, why in (("gpus", MAX_GPUS, "a larger job takes more memory than a "
                                 "node has"), ("iterations", MAX_ITERATIONS, "a longer run "
                                 "takes hours; localization reads windows of 50")):
            if getattr(self, name) > most:
                raise ValueError(f"SimConfig.{name}: got {getattr(self, name)}; expected at "
                                 f"most {most:,} ({why})")
        if self.gpus > 8 and self.gpus % 8:
            raise ValueError(
                f"SimConfig.gpus: got {self.gpus}; expected a multiple of 8 (8-GPU hosts) or <= 8"
            )
        if not (0 <= self.jitter < 1):
            raise ValueError(f"SimConfig.jitter: got {self.jitter!r}; expected 0 <= jitter < 1")
        if not (0 <= self.drift < 0.5):
            raise ValueError(f"SimConfig.drift: got {self.drift!r}; expected 0 <= drift < 0.5")
        if not (0 <= self.comm_drift < 1.0):
            raise ValueError(
                f"SimConfig.comm_drift: got {self.comm_drift!r}; expected 0 <= comm_drift < 1")
        # ("1,1,1,1.4" was refused as "stage_weights[0]: got '1'", blaming a character)
        object.__setattr__(self, "stage_weights", _sequence(
            self.stage_weights, "SimConfig.stage_weights",
            "a tuple of numbers, one per pipeline stage, e.g. (1, 1, 1, 1.4), or () for "
            "balanced stages"))
        for i, w in enumerate(self.stage_weights):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.1 <= w <= 10:
                raise ValueError(f"SimConfig.stage_weights[{i}]: got {w!r}; expected a number "
                                 "from 0.1 to 10 (the stage's compute over an even split)")
        if not (0 <= self.seq_imbalance <= 1):
            raise ValueError(f"SimConfig.seq_imbalance: got {self.seq_imbalance!r}; expected "
                             "0 <= seq_imbalance <= 1")
        for i, f in enumerate(self.faults):
            if not isinstance(f, FaultSpec):
                raise ValueError(f"SimConfig.faults[{i}]: got {f!r}; expected a FaultSpec")
            bad = [r for r in f.ranks if r >= self.gpus]
            if bad:
                raise ValueError(
                    f"SimConfig.faults[{i}].ranks: got rank {bad[0]}; expected < gpus ({self.gpus})"
                )
            if f.start_iteration >= self.iterations:
                raise ValueError(
                    f"SimConfig.faults[{i}].start_iteration: got {f.start_iteration}; expected < "
                    f"iterations ({self.iterations})"
                )
        layout = self._resolve_layout()
        object.__setattr__(self, "_layout", layout)
        pp = layout.pp
        if self.stage_weights and len(self.stage_weights) != pp:
            raise ValueError(f"SimConfig.stage_weights: got {len(self.stage_weights)} weights; "
                             f"expected one per pipeline stage ({pp})")

    @property
    def pod_hosts(self) -> int:
        """Hosts per pod actually used (resolves ``hosts_per_pod=None``)."""
        if self.hosts_per_pod is not None:
            return self.hosts_per_pod
        hosts = max(1, -(-self.gpus // 8))
        return 32 if hosts >= 128 else max(1, -(-hosts // 4))

    @property
    def layout(self) -> Layout:
        assert self._layout is not None
        return self._layout

    def _resolve_layout(self) -> Layout:
        spec = MODELS[self.model]
        dtp, dpp = DEFAULT_TP_PP[self.model]
        tp = self.tp or dtp
        pp = self.pp or dpp
        fixed = self.cp * self.ep * (self.dp or 1)

        def fits(t: int, p: int) -> bool:
            return self.gpus % (t * p * fixed) == 0 and spec.layers % p == 0

        # Shrink the defaults (never user-given sizes) until the job fits in the GPUs.
        while not fits(tp, pp) and self.pp is None and pp > 1:
            pp //= 2
        while not fits(tp, pp) and self.tp is None and tp > 1:
            tp //= 2
        dp = self.dp or max(1, self.gpus // (tp * pp * self.cp * self.ep))
        world = tp * pp * dp * self.cp * self.ep
        if world != self.gpus:
            rest = tp * self.cp * self.ep * pp
            fix = (f"drop dp to derive it, or give dp={self.gpus // rest}"
                   if self.dp and self.gpus % rest == 0 else
                   f"make gpus divisible by tp*cp*ep*pp={rest}")
            raise ValueError(
                f"SimConfig: layout tp={tp} x cp={self.cp} x ep={self.ep} x dp={dp} x pp={pp} = "
                f"{world} GPUs; expected exactly gpus={self.gpus} ({fix})"
            )
        if spec.layers % pp:
            raise ValueError(
                f"SimConfig.pp: got {pp}; expected a divisor of {self.model}'s {spec.layers} layers"
            )
        if spec.heads % tp or spec.kv_heads % min(tp, spec.kv_heads):
            raise ValueError(
                f"SimConfig.tp: got {tp}; expected a divisor of {self.model}'s {spec.heads} heads"
            )
        if self.ep > 1 and (not spec.is_moe or spec.experts % self.ep):
            raise ValueError(
                f"SimConfig.ep: got {self.ep}; expected 1 for dense {self.model}"
                if not spec.is_moe
                else f"SimConfig.ep: got {self.ep}; expected a divisor of {spec.experts} experts"
            )
        if spec.seq_len % self.cp:
            raise ValueError(
                f"SimConfig.cp: got {self.cp}; expected a divisor of the sequence length "
                f"{spec.seq_len}"
            )
        if dp % self.dp_replicate:
            raise ValueError(
                f"SimConfig.dp_replicate: got {self.dp_replicate}; expected a divisor of "
                f"dp={dp} (dp = dp_replicate x dp_shard)"
            )
        micro = self.microbatches or max(pp, 4)
        return Layout(
            tp=tp, cp=self.cp, ep=self.ep, dp=dp, pp=pp, microbatches=micro,
            dp_replicate=self.dp_replicate,
        )

    def to_dict(self) -> dict:
        """The ``config.json`` of a simulated job: this configuration with its layout filled
        in and its faults as given (a drawn device stays drawn: :meth:`from_dict` of it
        simulates the same job again; the resolved faults are ``faults.json``)."""
        lay = self.layout
        return {
            "gpus": self.gpus,
            "model": self.model,
            **lay.as_dict(),
            "dp_replicate": lay.dp_replicate,
            "microbatches": lay.microbatches,
            "iterations": self.iterations,
            "seed": self.seed,
            "jitter": self.jitter,
            "drift": self.drift,
            "comm_drift": self.comm_drift,
            "stage_weights": list(self.stage_weights),
            "seq_imbalance": self.seq_imbalance,
            "log_compute": self.log_compute,
            "calibrate_from": None if self.calibrate_from is None else str(self.calibrate_from),
            "hardware": self.hardware,
            "hosts_per_pod": self.pod_hosts,
            "spines": self.spines,
            "micro_batch_size": self.micro_batch_size,
            "job": self.job,
            "faults": [f.to_dict() for f in self.faults],
        }

    @classmethod
    def from_dict(cls, data: dict) -> SimConfig:
        """Inverse of :meth:`to_dict`: the configuration a ``config.json`` holds, to simulate
        that job again (``holmes simulate`` records under ``derived`` what it computed, which is
        not an input and is ignored). An unknown key is refused, naming it.

        >>> cfg = SimConfig(gpus=16, iterations=4, faults=(FaultSpec.parse("gpu_slow"),))
        >>> SimConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
        True
        """
        from dataclasses import fields

        known = {f.name for f in fields(cls) if f.init}
        # derived values some config.json files carry beside the inputs
        unknown = sorted(set(data) - known - {"derived", "chunks_per_microbatch"})
        if unknown:
            raise ValueError(f"SimConfig: unknown key {unknown[0]!r}; expected keys among "
                             f"{sorted(known)}")
        kw = {k: v for k, v in data.items() if k in known}
        kw["faults"] = tuple(FaultSpec.from_dict(f) for f in data.get("faults") or ())
        if "stage_weights" in kw:
            kw["stage_weights"] = tuple(kw["stage_weights"] or ())
        return cls(**kw)


def _sequence(value: object, name: str, expected: str) -> tuple:
    """``value`` as a tuple; a string, a scalar or None is refused naming ``name``."""
    if not isinstance(value, (str, bytes)) and isinstance(value, Iterable):
        try:
            return tuple(value)
        except TypeError:  # iterable in name only (a 0-d numpy array)
            pass
    got = "None" if value is None else f"the {type(value).__name__} {value!r}"
    raise ValueError(f"{name}: got {got}; expected {expected}")


def _is_int(value: object) -> bool:
    """An integer (a numpy one too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A real number (a numpy one too), not a bool or a string."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)

