"""Typed results of localization: device kinds, evidence, candidates, workload findings, verdict.

Everything here is a frozen dataclass (or an enum): fields cannot be reassigned, results compare
equal field by field in tests, and :meth:`Verdict.to_dict` serialises them into the one JSON
contract the CLI and service expose. (Those holding dicts, a candidate's ``coords``, a verdict's
``stats``, are not hashable.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from holmes_ml._text import spans


class DeviceKind(str, Enum):
    """What a candidate is: the kind prefix of a topology device id."""

    GPU = "gpu"
    NIC = "nic"
    LINK = "link"
    SWITCH = "switch"
    HOST = "host"

    @classmethod
    def of(cls, device: str) -> DeviceKind:
        """Kind of a topology device id such as ``'nic:h3/1'``."""
        head, sep, _ = device.partition(":")
        try:
            return cls(head)
        except ValueError:
            raise ValueError(
                f"device id {device!r}: unknown kind prefix {head!r}; expected one of "
                + ", ".join(k.value for k in cls)
            ) from None


@dataclass(frozen=True)
class Evidence:
    """One observation supporting a candidate.

    Parameters
    ----------
    iteration, group, seq, op:
        The operator instance (collective or P2P pair) where the observation was made.
    rule:
        ``"straggler"`` (the candidate arrived last and its lateness is not explained by an
        earlier wait), ``"p2p-chain"`` (reached by following a late send upstream),
        ``"communication"`` (every copy was slow: the transfer itself), ``"host-stall"`` or
        ``"comm-gap"`` (the candidate's communication time in the iteration fell far below its
        host-mates': they waited for it; ``group`` is then ``host:H``, ``seq`` -1, ``op`` empty).
    detail:
        Human-readable sentence.
    weight:
        Microseconds of operator time this observation explains.
    """

    iteration: int
    group: str
    seq: int
    op: str
    rule: str
    detail: str
    weight: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration": int(self.iteration),
            "group": self.group,
            "seq": int(self.seq),
            "op": self.op,
            "rule": self.rule,
            "detail": self.detail,
            "weight": round(float(self.weight), 3),
        }


@dataclass(frozen=True)
class Candidate:
    """A suspect device with its score and the evidence behind it.

    ``score`` is the share (0 … 1) of the window's slowdown the candidate explains. Network
    devices crossed by the same slow flows are alternative explanations of that slowdown, each
    with its own share, so the scores of one verdict need not sum to 1. ``tied_with`` lists the
    other network candidates (NIC, link, switch) with exactly this score: devices the logs
    cannot tell apart (the two NICs of a slow send/recv pair with no other traffic, the NICs of
    one slow ring, a NIC and the leaf-spine link that only its flows cross); their order among
    themselves carries no information. A GPU candidate may be tied with its host: a rank that
    meets its peers too rarely in a step for the logs to tell a slow GPU from a pause of its
    host (:attr:`LocalizeConfig.kind_min_ops`), or one found by the comm-gap fallback alone
    (a step's communication time shows that a rank was late, not how).
    """

    kind: DeviceKind
    device: str
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    score: float
    coords: dict[str, int] | None = None
    evidence: tuple[Evidence, ...] = ()
    tied_with: tuple[str, ...] = ()

    def to_dict(self, max_evidence: int = 5) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "device": self.device,
            "ranks": [int(r) for r in self.ranks],
            "hosts": [str(h) for h in self.hosts],
            "score": round(float(self.score), 6),
            "coords": dict(self.coords) if self.coords else None,
            "evidence": [e.to_dict() for e in self.evidence[:max_evidence]],
            "tied_with": list(self.tied_with),
        }


@dataclass(frozen=True)
class WorkloadFinding:
    """A slowdown explained by the workload (not by a device), e.g. a heavier pipeline stage.

    Parameters
    ----------
    kind:
        ``"stage-imbalance"`` (one pipeline stage is consistently the last to arrive) or
        ``"rank-imbalance"`` (the late data-parallel rank changes from step to step, as with
        sequence-length imbalance).
    ranks:
        Ranks involved (the heavy stage, or every rank that was late at some step).
    share:
        From waits: the fraction of the explained wait time covered by this finding. From
        compute: the heavy stage's extra compute per step as a fraction of the usual step.
    detail:
        Human-readable sentence.
    basis:
        What the finding was read from: ``"waits"`` (the abnormal operators' lateness),
        ``"compute"`` (each rank's compute time per step, where the logs carry it) or ``"gaps"``
        (where they do not: each rank's time outside communication per step, from its
        operators' starts and durations).
    """

    kind: str
    ranks: tuple[int, ...]
    share: float
    detail: str
    coords: dict[str, int] | None = None
    basis: str = "waits"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ranks": [int(r) for r in self.ranks],
            "share": round(float(self.share), 6),
            "coords": dict(self.coords) if self.coords else None,
            "detail": self.detail,
            "basis": self.basis,
        }


#: What the reader noticed about its input (a count in :attr:`Verdict.stats` under the key),
#: said in the verdict's note in this order; ``{n}`` is the count.
INPUT_NOTES: dict[str, str] = {
    "reused_key_rows": "{n:,} operator rows share rank, group, seq, op and iteration with a "
                       "different row: logs of two runs (or of a restarted job) seem mixed, and "
                       "their statistics with them; analyse one run at a time",
    "unread_files": "{n} Parquet log file(s) were not read: no footer yet (a running job's "
                    "logger writes it when it closes the file) or their writer was killed (see "
                    "the reader's warning); their ranks' operators are missing",
    "gloo_groups_merged_ranks": "the gloo operations of {n} rank(s) were read as one group of "
                                "the whole world: their profiler traces do not tell which "
                                "process group ran each (see the reader's warning), so "
                                "operations of different groups may have been compared as one",
    "kineto_renumbered_ranks": "the profiler traces of {n} rank(s) number the job's steps "
                               "differently (their profiler started at another step): their "
                               "steps were renumbered to match (see the reader's warning)",
    "kineto_steps_left_out": "{n} step(s) that only some ranks' profiler traces hold were left "
                             "out (see the reader's warning); the steps every trace holds were "
                             "analysed",
}


@dataclass(frozen=True)
class Verdict:
    """Outcome of localizing one window of logs.

    ``candidates`` are best first and empty when the job is healthy or when the slowdown is
    explained by the workload (then see ``workload_findings``).
    """

    irregular: bool
    irregular_iterations: tuple[int, ...] = ()
    candidates: tuple[Candidate, ...] = ()
    workload_findings: tuple[WorkloadFinding, ...] = ()
    stats: dict[str, float] = field(default_factory=dict, compare=False)
    #: ranks that the communicators' member lists or the topology name but that logged nothing
    silent_ranks: tuple[int, ...] = field(default=(), compare=False)
    #: ranks whose logs (or summaries) lack some of the analysed iterations that the others hold
    lacking_ranks: tuple[int, ...] = field(default=(), compare=False)
    #: hosts the topology places ranks on none of which logged anything (an agent not running)
    silent_hosts: tuple[str, ...] = field(default=(), compare=False)

    @property
    def note(self) -> str | None:
        """A caveat the reader of the verdict needs, or ``None``.

        Suspects or workload findings without any irregular iteration come from the abnormal
        operators of the last iterations alone: the slowdown was there since the log began, or
        is smaller than ``delta``. A log longer than the window is analysed over the most
        recent irregular iterations: earlier ones, and later steps, are left out, and the note
        says how to look at them. Fewer than two ranks leave nothing to compare a copy with.
        Rows of two runs read together mix every statistic, and so do gloo operations of
        several process groups read as one. Parquet logs left unread (no footer) leave their
        ranks out. Profiler traces started at different steps were renumbered or cut to the
        steps every rank holds. Logs of too few iterations for the irregularity
        monitor (a Flight Recorder or NCCL Inspector dump is one) cannot show a slowdown as such.
        """
        notes = []
        for key, text in INPUT_NOTES.items():
            n = int(self.stats.get(key, 0))
            if n:
                notes.append(text.format(n=n))
        if self.silent_ranks:
            few = ", ".join(map(str, self.silent_ranks[:8])) + (
                " ..." if len(self.silent_ranks) > 8 else "")
            hosts = (f"; every rank of host(s) {', '.join(self.silent_hosts[:8])}"
                     + (" ..." if len(self.silent_hosts) > 8 else "") + ": is its agent "
                     "running?" if self.silent_hosts else "")
            notes.append(f"{len(self.silent_ranks)} rank(s) that the communicators' member lists "
                         f"or the topology name logged nothing ({few}{hosts}): their logs are missing "
                         "(not recorded, read or sent yet), or they never ran; a device of theirs is "
                         "named only from what their peers waited for (with a topology), else "
                         "not at all")
        if self.lacking_ranks:
            few = spans(self.lacking_ranks[:64]) + (" ..." if len(self.lacking_ranks) > 64
                                                   else "")
            notes.append(f"{len(self.lacking_ranks)} rank(s) lack some of the analysed "
                         f"iterations ({few}): their logs stop early or have gaps (an agent "
                         "that stopped, a log cut short); where a collective waited for none "
                         "but them, they are suspects from their peers' waits alone, unless "
                         "they waited like the others in the irregular steps their logs hold")
        if self.stats.get("ranks", 2.0) < 2:
            notes.append("the logs hold one rank: peers cannot be compared, so a slow device "
                         "may go unnamed")
        first, last = self.stats.get("analysed_first"), self.stats.get("analysed_last")
        if first is not None and last is not None:
            left = int(self.stats.get("left_out_irregular", 0))
            if left:
                a, b = int(self.stats["left_out_first"]), int(self.stats["left_out_last"])
                since = int(self.stats.get("left_out_from", a))
                notes.append(
                    f"{left} irregular iteration(s) from {a} to {b} come before the "
                    f"{int(self.stats.get('analysed_iterations', 0))} analysed ones "
                    f"({int(first)}-{int(last)}, the most recent): localize them on their own, "
                    "with the regular iterations before them to compare against "
                    f"(holmes localize --iterations {since}:{b})")
            if self.stats.get("later_iterations", 0) and self.irregular:
                notes.append(
                    f"the iterations after {int(last)}, the last irregular one, were not "
                    f"analysed (holmes localize --iterations {int(last) + 1}: looks at them)")
        its, history = self.stats.get("iterations"), self.stats.get("min_history")
        from_ops = self.candidates or any(w.basis == "waits" for w in self.workload_findings)
        if its is not None and history is not None and its <= history and not self.irregular:
            # (Flight Recorder and NCCL Inspector dumps hold no iteration: all of it is one)
            notes.append(
                f"the logs (or the slice read) hold {int(its)} iteration(s): the irregularity "
                f"monitor needs {int(history)} regular ones before it can flag one, so no "
                "slowdown is seen "
                "as such; " + ("the findings come from the abnormal operators alone"
                               if from_ops else "that no device is named says little"))
        elif not self.irregular and from_ops:
            n = int(self.stats.get("analysed_iterations", 0))
            notes.append(
                "no iteration is delta-irregular (delta times slower than the ones before it); "
                f"the findings come from the abnormal operators of the last {n} iteration(s), "
                "as from a slowdown present since the logs (or the slice read) began or smaller "
                "than delta"
            )
        return "; ".join(notes) or None

    def to_dict(self, max_evidence: int = 5) -> dict[str, Any]:
        """The JSON contract: ``irregular``, ``irregular_iterations``, ``candidates`` (each with
        ``kind, device, ranks, hosts, score, coords, evidence``) and ``workload``: ``None``, or
        the main workload finding (``kind, ranks, share, coords, detail``) with any further
        findings under ``others``. Also ``note`` (:attr:`note`), ``slowdown``: the slowest
        irregular iteration's time over the usual one (None when none is irregular), and
        ``input``: the ``ops``, ``ranks`` and ``iterations`` read, the first and last iteration
        of the window analysed (``analysed``, when it has abnormal operators),
        ``usual_iteration_s``, the median time of those iterations not irregular (when known),
        and, when there are any, ``silent_ranks`` and ``lacking_ranks`` (:attr:`silent_ranks`,
        :attr:`lacking_ranks`)."""
        workload: dict[str, Any] | None = None
        if self.workload_findings:
            workload = self.workload_findings[0].to_dict()
            workload["others"] = [w.to_dict() for w in self.workload_findings[1:]]
        known = ("ops", "ranks", "iterations")
        read: dict[str, Any] | None = None
        if all(k in self.stats for k in known):
            read = {k: int(self.stats[k]) for k in known}
            if "usual_iteration_us" in self.stats:
                read["usual_iteration_s"] = round(self.stats["usual_iteration_us"] / 1e6, 6)
            if "analysed_first" in self.stats:  # the window the candidates come from
                read["analysed"] = [int(self.stats["analysed_first"]),
                                    int(self.stats["analysed_last"])]
            # ranks with no data (all of it, or some of the analysed iterations): what the
            # note says, for a dashboard to count
            if self.silent_ranks:
                read["silent_ranks"] = [int(r) for r in self.silent_ranks]
            if self.lacking_ranks:
                read["lacking_ranks"] = [int(r) for r in self.lacking_ranks]
        slowdown = self.stats.get("slowdown")
        return {
            "irregular": bool(self.irregular),
            "irregular_iterations": [int(i) for i in self.irregular_iterations],
            "candidates": [c.to_dict(max_evidence) for c in self.candidates],
            "workload": workload,
            "note": self.note,
            "slowdown": None if slowdown is None else round(float(slowdown), 4),
            "input": read,
        }
