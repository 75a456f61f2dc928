"""The comm-gap fallback: a rank whose host-mates' communication time grew by the wait it caused.

Known answers on hand-built iteration summaries, then the case it exists for: node agents scoring
hosts that each hold one whole tensor-parallel group.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from test_localize_rules import GPUS, HOSTS, _topology

from holmes_ml.localize import DeviceKind, LocalizeConfig
from holmes_ml.localize.rules import localize_records

ITER_US = 1_000_000.0  # usual iteration: 1 s
NO_RECORDS = pd.DataFrame(columns=["iteration", "rank", "op", "group", "seq", "nbytes",
                                   "start_ns", "duration_us", "excess_us"])
NO_GROUPS = pd.DataFrame(columns=["group", "group_kind", "group_ranks"])


def _iterations(slow: dict[int, list[int]], wait_us: float, iterations: int = 8,
                structural: dict[int, float] | None = None, seed: int = 0) -> pd.DataFrame:
    """Per (iteration, rank) summaries; in iteration ``i`` the ranks ``slow[i]`` compute late,
    their host-mates wait ``wait_us`` longer in communication and the iteration stretches."""
    rng = np.random.default_rng(seed)
    rows = []
    n = HOSTS * GPUS
    start = 0
    for it in range(iterations):
        late = slow.get(it, [])
        span = ITER_US + (wait_us if late else 0.0)
        for r in range(n):
            comm = 200_000.0 * (1 + 0.02 * rng.standard_normal())
            comm += (structural or {}).get(r, 0.0)
            if late and r not in late and any(r // GPUS == s // GPUS for s in late):
                comm += wait_us
            rows.append((it, r, start, start + int(span * 1e3), comm, 50))
        start += int(span * 1e3)  # one step after the other
    return pd.DataFrame(rows, columns=["iteration", "rank", "start_ns", "end_ns", "comm_us",
                                       "n_ops"])


def _verdict(its: pd.DataFrame, irregular: tuple[int, ...], **cfg):
    return localize_records(NO_RECORDS, NO_GROUPS, its, _topology(), LocalizeConfig(**cfg),
                            irregular)


@pytest.mark.parametrize("rank", [0, 6, 15])
def test_the_rank_its_host_mates_waited_for_is_named(rank):
    its = _iterations({i: [rank] for i in range(4, 8)}, wait_us=300_000.0)
    v = _verdict(its, (4, 5, 6, 7))
    assert [c.ranks for c in v.candidates] == [(rank,)]
    top = v.candidates[0]
    assert top.kind is DeviceKind.GPU and top.score == pytest.approx(1.0)
    # a step's communication time tells that the rank was late, not whether its GPU or its
    # host was slow: the verdict says so
    assert top.tied_with == (f"host:h{rank // GPUS}",)
    assert top.evidence and all(e.rule == "comm-gap" for e in top.evidence)
    assert top.evidence[0].group == f"host:h{rank // GPUS}"
    assert v.stats["comm_gap_candidates"] == 1.0
    # the fallback is a knob: off, the records alone decide (and there are none)
    assert _verdict(its, (4, 5, 6, 7), comm_gap_fallback=False).candidates == ()


def test_a_gap_below_the_slowdown_asked_about_is_jitter():
    # delta 1.1 of a 1 s iteration: a rank must have held its host back ~100 ms
    its = _iterations({i: [5] for i in range(4, 8)}, wait_us=40_000.0)
    assert _verdict(its, (4, 5, 6, 7)).candidates == ()


def test_a_usual_gap_is_not_a_wait():
    # rank 5 always communicates 300 ms less (its place in the pipeline, say): no new wait
    its = _iterations({}, wait_us=0.0, structural={5: -300_000.0})
    assert _verdict(its, (4, 5, 6, 7)).candidates == ()


def test_two_ranks_of_one_host_or_a_single_step_do_not_make_an_origin():
    two = _iterations({i: [4, 5] for i in range(4, 8)}, wait_us=300_000.0)
    assert _verdict(two, (4, 5, 6, 7)).candidates == ()
    # one iteration out of four irregular ones is not "in most of them"
    once = _iterations({4: [5]}, wait_us=300_000.0)
    assert _verdict(once, (4, 5, 6, 7)).candidates == ()
    # ... but a one-step spike that is the only irregular step is
    assert [c.ranks for c in _verdict(once, (4,)).candidates] == [(5,)]


def test_a_gap_on_many_hosts_in_the_same_steps_was_shared():
    # GPU 1 of three hosts falls behind in the same irregular steps: a cause they shared (one
    # pipeline stage of every replica tied to its slowest member), as for the records'
    # stragglers (max_step_hosts); on two hosts it may be two faults, and both are named
    three = _iterations({i: [1, GPUS + 1, 2 * GPUS + 1] for i in range(4, 8)}, wait_us=300_000.0)
    assert _verdict(three, (4, 5, 6, 7)).candidates == ()
    assert len(_verdict(three, (4, 5, 6, 7), max_step_hosts=3).candidates) == 3
    two = _iterations({i: [1, GPUS + 1] for i in range(4, 8)}, wait_us=300_000.0)
    assert sorted(c.ranks for c in _verdict(two, (4, 5, 6, 7)).candidates) == [(1,), (GPUS + 1,)]


def test_healthy_and_regular_windows_are_left_alone():
    its = _iterations({}, wait_us=0.0)
    assert _verdict(its, ()).candidates == ()
    assert _verdict(its, (3,)).candidates == ()


@pytest.mark.parametrize("rank", [2, 13])
def test_a_gpu_slow_from_the_first_step_is_named_against_its_replicas(rank):
    # no iteration is irregular (every one is slow alike): the rank's usual gap comes from the
    # same GPU of the other hosts, whose host-mates did not wait
    its = _iterations({i: [rank] for i in range(8)}, wait_us=300_000.0)
    v = _verdict(its, ())
    assert not v.irregular
    assert [c.ranks for c in v.candidates] == [(rank,)]
    assert "other replicas" in v.candidates[0].evidence[0].detail
    assert _verdict(its, (), comm_gap_fallback=False).candidates == ()
    # below the slowdown asked about, or on a single step of eight, it is jitter
    assert _verdict(_iterations({i: [rank] for i in range(8)}, wait_us=40_000.0),
                    ()).candidates == ()
    assert _verdict(_iterations({3: [rank]}, wait_us=300_000.0), ()).candidates == ()


def test_a_gap_every_replica_shows_is_its_role_not_a_wait():
    # GPU 1 of every host communicates 300 ms less (its place in the ring, say): a role, which
    # the other replicas share, so no one waited for it
    its = _iterations({}, wait_us=0.0, structural={h * GPUS + 1: -300_000.0 for h in range(HOSTS)})
    assert _verdict(its, ()).candidates == ()


@pytest.mark.parametrize("seed", [0, 1])
def test_agents_on_tp8_hosts_name_the_slow_gpu(seed):
    """Each 8-GPU host is one tensor-parallel group: scored on its own, the faulty host flags
    almost none of the waits its slow GPU causes; the summaries' communication times name it."""
    from holmes_ml.io import without_labels
    from holmes_ml.pipeline import localize_summaries, summarize_per_host
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    rng = np.random.default_rng(seed)
    rank = int(rng.integers(0, 256))
    res = simulate(SimConfig(gpus=256, model="llama2-70b", tp=8, pp=8, iterations=8, seed=seed,
                             faults=(FaultSpec.parse(f"gpu_slow:rank={rank},severity=1.0,"
                                                     "start=3"),)))
    ops = without_labels(res.ops)
    cfg = LocalizeConfig()
    verdict = localize_summaries(summarize_per_host(ops, None, cfg), res.topology, cfg)
    assert verdict.candidates and verdict.candidates[0].ranks == (rank,)


@pytest.mark.parametrize("seed", [2, 3])
def test_agents_on_tp8_hosts_name_a_gpu_slow_from_the_first_step(seed):
    """The same job with the GPU slow from its first logged iteration: no iteration is
    irregular, and the healthy twin (same seed, no fault) names no one."""
    from holmes_ml.io import without_labels
    from holmes_ml.pipeline import localize_summaries, summarize_per_host
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    rank = int(np.random.default_rng(seed).integers(0, 256))
    job = SimConfig(gpus=256, model="llama2-70b", tp=8, pp=8, iterations=6, seed=seed)
    cfg = LocalizeConfig()
    for faults, want in (((FaultSpec.parse(f"gpu_slow:rank={rank},severity=1.0"),), (rank,)),
                         ((), None)):
        res = simulate(replace(job, faults=faults))
        verdict = localize_summaries(summarize_per_host(without_labels(res.ops), None, cfg),
                                     res.topology, cfg)
        assert not verdict.irregular
        assert (verdict.candidates[0].ranks if verdict.candidates else None) == want
