"""Knobs of localization, in one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocalizeConfig:
    """How the operator-GPU graph rules and the cross-iteration ranking decide.

    Parameters
    ----------
    window:
        Most recent iterations with abnormal operator records that are analysed (older ones are
        ignored). Every such iteration counts, irregular or not: a fault present from the first
        step never makes an iteration *irregular* relative to its neighbours, but its abnormal
        operators are still there. When the last irregular iteration comes before them (a long
        log whose slow episode is over: later steps still hold a few abnormal operators, jitter
        the detector flags), the window is the ``window`` most recent up to that iteration, so
        that the verdict speaks of the steps it reports irregular; its note names what was left
        out (earlier irregular iterations, the steps after the window).
    score_threshold:
        Operator score at or above which an operator copy is abnormal. ``None``: the model's
        ``threshold_`` (or 0.5).
    follow_fraction:
        Backtracking: a straggler's lateness counts as *explained* by its previous operator when
        it waited there at least this fraction of the lateness; the search then moves to whoever
        it waited for.
    late_fraction:
        In a collective whose every copy is abnormal, the member that arrived after all the
        others by at least this fraction of their median excess held them up: it is the
        instance's straggler (its own copy flagged too, say on a loaded machine), not a slow
        link, whose members arrive together. 0: such an instance is always the communication's.
    min_wait_us:
        Waits and excess transfer times below this are noise (clock resolution, launch jitter).
    rel_excess:
        A transfer is slow when it exceeds its class's typical time by this fraction.
    gap_fraction:
        A wait is abnormal only above this fraction of the compute time just before it: partners
        of a rank wait for its compute jitter, which grows with the compute segment.
    gap_sigmas:
        ... or above this many times the job's compute jitter (sigma of the relative spread of
        one compute segment across the ranks that run it, read from the logs), when larger: at
        3 % jitter 3 sigma is 0.09 and ``gap_fraction`` decides; on a cluster with 10 % jitter
        the bar rises to 0.3 of the gap.
    min_evidence:
        Operator instances a candidate needs. A late rank with fewer still counts when, in one
        of them, its partners waited longer than a usual step (measured end to end: that step
        took twice as long or more). In a pure data-parallel job a one-off pause of a rank is
        a single late arrival at the step's one gradient all-reduce.
    min_weight_fraction:
        A candidate's explained time per analysed iteration must reach this fraction of the
        median iteration time; below it the slowdown is within normal jitter.
    min_share:
        Candidates whose normalised score is below this are dropped. Ranks share the stragglers'
        total lateness above background; network devices are alternatives for the same slow
        flows, so each is measured against the total excess of the slow flows.
    min_step_share:
        A GPU or host is a suspect only if, in at least one analysed iteration, it fell this
        share of ``(delta - 1)`` x the usual (median regular) iteration time behind its
        partners: the slowdown the user asked to hear about. How far behind is read off the
        waits it caused; one pause waited for by its TP peers, then its pipeline receiver,
        then its gradient ring counts once, while the waits a slow GPU causes at each of its
        TP all-reduces add up (``rules._fell_behind``). Ranks of a healthy job are late by
        far less (jitter, a slowdown every rank shares such as drift).
    min_device_step_share:
        The same for a NIC, link or switch: in at least one analysed iteration, the slow
        transfers of the flows crossing it (overlapping ones counted once) must add up to this
        share of ``(delta - 1)`` x the usual iteration time. Lower than for ranks because the
        excess of the transfers is a lower bound of what a slow device costs the step (the
        ranks waiting on them are not counted): at the weakest NIC and link faults of
        ``holmes bench localize`` it reaches 0.54-0.7 of the bar, while transfers that jitter
        slowed in a healthy job mostly reach 0.25-0.35 (of the bench's 327 healthy jobs, one
        reaches 0.6: a ring 19 % slower than its peers in the last step of a drifting job).
    min_flow_share:
        Network rules: a flow (a ring, or the traffic between two ranks) whose slow transfers
        add up to less than this share of the heaviest slow flow's excess is not counted as
        slow: jitter stretches a transfer of some flow here and there by a few hundred
        microseconds, and counted as slow such a flow would be one more flow a device on its
        path explains (parsimony) and one healthy witness fewer. A faulty device's own lightest
        flows carry percents of its heaviest (a slow NIC's pipeline pair beside its
        data-parallel ring: 1.6-1.8 % in ``tests/test_localize_kinds.py``'s jobs). 0: every
        slow flow counts.
    max_step_hosts:
        A step in which ranks on more than this many hosts each held their partners back by
        the GPU/host floor (``min_step_share``) was slowed by a cause those ranks shared (a
        collective that ties one pipeline stage of every replica to its slowest member), not by
        one of them: it does not count toward any rank's floor. One faulty GPU or host makes
        the ranks of one host late; 2 leaves room for two faults in the same step.
    step_peer_share:
        Which ranks count toward those hosts: the ones that held their partners back by at
        least this share of the GPU/host floor. Below 1 so that ranks late *together* are seen
        as such even when only some of them clear the floor: estimates of lateness move by a
        few per cent with the window they are taken over (a node agent's trailing context
        against a whole window), and a rank at 1.02 x the floor must not be singled out from
        peers at 0.97 x (the live agents' one healthy alarm in ``holmes bench agents``, gone
        at 0.5). Every faulty trial of ``holmes bench localize`` gets the same verdict at 0.5
        as with the floor itself. The comm-gap fallback applies the same test to its gaps.
    together_fraction:
        Late ranks on different hosts whose lateness in a step ends at the same instant, within
        this fraction of the shorter lateness, were let go together by one event (a collective
        or a wait the logs do not show): none of them is singled out in that step (they still
        count toward the hosts late in it, ``max_step_hosts``), nor in any step when that is how
        the rank is late in at least half of its late steps. Independent
        stragglers arrive when their own work is done; 1 % of a lateness that must already
        reach ``min_step_share`` of the slowdown asked about is far wider than the spread of
        one release (milliseconds) and far narrower than the chance that two unrelated
        arrivals meet. 0 turns the test off.
    top_k:
        Candidates returned at most.
    host_concentration:
        A straggler is called a *host* stall (not a slow GPU) when, in the iterations it is
        blamed for, at least this share of its lateness arrives in one jump (partners wait for
        it a full pause at once) rather than piece by piece (a slow GPU falling behind): both
        its largest wait against the small ones and the largest single step by which it fell
        behind against how far it fell (see ``rules._pause_concentration``).
    kind_min_ops:
        That test needs a rank that meets its peers again and again while it computes: one that
        takes part in fewer operators than this per iteration (median), such as a pure
        data-parallel rank whose step ends in one gradient all-reduce, shows a slow GPU and a
        pause of its host alike, as one late arrival per step. Such a straggler is named a GPU
        ``tied_with`` its host rather than one of them by a coin flip, unless another rank of
        its host was about as late in the same step (a pause of the whole host). Pipeline or
        tensor parallelism puts 10 or more operators in a step, and there the test decides.
    workload_min_iterations:
        Workload rules need at least this many analysed iterations.
    workload_persistence:
        Workload rules need the lateness to persist: at least this share of the analysed
        iterations must each carry a quarter or more of the heaviest iteration's lateness. One
        long pause (a host stall) or a fault spike is an episode, not a workload property.
    quiet_persistence:
        Where no switch is known (logs read without a topology: the NICs are the only network
        devices) and no iteration is irregular, a NIC must have slowed one of its flows in at
        least this share of the analysed iterations. A fault that slows no step delta x is
        older than the window or milder than delta, and slows its flows step after step;
        jitter and drift slow a ring here, another there, and with the switches known those
        scattered slow flows are spread over the spines they cross, which their healthy flows
        clear; with NICs alone, two slow steps of a noisy ring would name one of its NICs.
    with_rule:
        With an ML detector, also count as abnormal the copies the "3σ + rule" baseline flags
        (union). Off: the detector alone decides.
    comm_gap_fallback:
        When the operator records name no one, look for a rank whose communication time per
        iteration (from the iteration summaries) fell far below its host-mates': they waited for
        it (see ``holmes_ml.localize.rules._comm_gap_candidates``). In an irregular window its
        usual gap comes from the regular iterations; when no iteration is irregular (a fault
        present from the first step), from the same GPU of the other data-parallel replicas.
        This is what finds a slow GPU when a node agent scores a host that holds exactly one
        tensor-parallel group. Off: the records alone decide.
    delta:
        An iteration is irregular when it takes ``delta`` x its robust reference (the median of
        earlier regular iterations). Holmes finds that below about 1.04 normal jitter swamps
        the signal.
    reference_shift:
        The reference duration of an operator class (the rule's median and MAD, each abnormal
        copy's ``excess_us``) is its median over the whole window, unless that is more than
        ``reference_shift`` x its median over the regular iterations: then a slowdown has
        lasted most of the window and become the class's norm (the waits of a one-communicator
        job's straggler, at many times their usual length), and the regular iterations are the
        reference. Gradual drift (transfers 20 % slower by the end of a run) moves the window's
        median a few per cent and keeps it: against early steps alone, every late transfer of
        a drifting job would look slow. 0 disables the switch.
    """

    window: int = 50
    score_threshold: float | None = None
    follow_fraction: float = 0.5
    late_fraction: float = 0.5
    min_wait_us: float = 50.0
    rel_excess: float = 0.15
    gap_fraction: float = 0.1
    gap_sigmas: float = 3.0
    min_evidence: int = 2
    min_weight_fraction: float = 0.02
    min_share: float = 0.05
    min_step_share: float = 1.0
    min_device_step_share: float = 0.4
    min_flow_share: float = 0.001
    max_step_hosts: int = 2
    step_peer_share: float = 0.5
    together_fraction: float = 0.01
    top_k: int = 5
    host_concentration: float = 0.7
    kind_min_ops: int = 4
    workload_min_iterations: int = 4
    workload_persistence: float = 0.5
    quiet_persistence: float = 0.25
    with_rule: bool = True
    comm_gap_fallback: bool = True
    delta: float = 1.1
    reference_shift: float = 1.5

    def __post_init__(self) -> None:
        for name in ("window", "top_k", "min_evidence", "workload_min_iterations",
                     "max_step_hosts", "kind_min_ops"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"LocalizeConfig.{name}: got {value!r}; expected an int >= 1")
        for name in ("follow_fraction", "late_fraction", "min_share", "host_concentration",
                     "min_weight_fraction", "workload_persistence", "quiet_persistence",
                     "min_step_share",
                     "min_device_step_share", "min_flow_share", "step_peer_share",
                     "together_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"LocalizeConfig.{name}: got {value!r}; expected 0 <= value <= 1")
        if self.score_threshold is not None and not 0.0 <= self.score_threshold <= 1.0:
            raise ValueError(
                f"LocalizeConfig.score_threshold: got {self.score_threshold!r}; expected None or "
                "a score in [0, 1]"
            )
        if not (self.reference_shift == 0 or self.reference_shift >= 1.0):
            raise ValueError(f"LocalizeConfig.reference_shift: got {self.reference_shift!r}; "
                             "expected 0 (off) or a factor >= 1")
        if not self.delta > 1.0:
            raise ValueError(f"LocalizeConfig.delta: got {self.delta!r}; expected a factor > 1")
        if (self.min_wait_us < 0 or self.rel_excess < 0 or self.gap_fraction < 0
                or self.gap_sigmas < 0):
            raise ValueError(
                "LocalizeConfig.min_wait_us / rel_excess / gap_fraction / gap_sigmas: got "
                f"{self.min_wait_us!r} / {self.rel_excess!r} / {self.gap_fraction!r} / "
                f"{self.gap_sigmas!r}; expected values >= 0"
            )
