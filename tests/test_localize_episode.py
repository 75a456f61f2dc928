"""One long pause is an episode on a host, not a workload property (issue 5's stall drill).

Hand-built jobs: 4 hosts x 4 GPUs; every step computes, all-reduces inside the host (tp), computes
and all-reduces across hosts (dp). A different rank is a little late in every step (the jitter of
a loaded machine, large enough to count); on top of that, either one host pauses once (all of its
GPUs at the same time) or the late rank is heavily late in every step (sequence-length imbalance).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from holmes_ml.localize import DeviceKind, LocalizeConfig
from holmes_ml.pipeline import analyze
from holmes_ml.topology import Group, Topology

HOSTS, GPUS = 4, 4
COMPUTE_US, XFER_US = 10_000.0, 500.0


def _topology() -> Topology:
    n = HOSTS * GPUS
    ranks = pd.DataFrame({"rank": np.arange(n), "host": [f"h{r // GPUS}" for r in range(n)],
                          "gpu": np.arange(n) % GPUS, "pod": 0})
    for k in ("tp", "cp", "ep", "pp", "dp"):
        ranks[k] = -1
    groups = {f"tp-{h}": Group(f"tp-{h}", "tp", tuple(range(h * GPUS, (h + 1) * GPUS)))
              for h in range(HOSTS)}
    groups.update({f"dp-{g}": Group(f"dp-{g}", "dp", tuple(h * GPUS + g for h in range(HOSTS)))
                   for g in range(GPUS)})
    return Topology(ranks=ranks, groups=groups, spines=0)


def _ops(topo: Topology, seed: int, late_us: float, stall_host: int = -1, stall_it: int = -1,
         stall_us: float = 0.0, iterations: int = 12, slow_rank: int = -1,
         slow_its: tuple[int, ...] = (), slow_us: float = 0.0, tp_phases: int = 1
         ) -> pd.DataFrame:
    """``late_us``: how late one random rank is in each step; ``stall_host`` pauses
    ``stall_us`` once, at iteration ``stall_it``, on all of its GPUs; ``slow_rank`` computes
    ``slow_us`` longer (in its first tp phase) in the steps ``slow_its``; ``tp_phases`` tp
    compute + all_reduce phases per step before the dp one."""
    rng = np.random.default_rng(seed)
    n = len(topo.ranks)
    clock = np.zeros(n)
    seqs: dict[str, int] = {}
    rows = []
    for it in range(iterations):  # loops over steps and groups build the input, not hot code
        late = int(rng.integers(n))
        for k, phase in enumerate(["tp"] * tp_phases + ["dp"]):
            comp = COMPUTE_US * (1 + 0.01 * rng.standard_normal(n))
            if phase == "tp" and k == 0:
                comp[late] += late_us
                if it in slow_its:
                    comp[slow_rank] += slow_us
                if it == stall_it:
                    comp[stall_host * GPUS:(stall_host + 1) * GPUS] += stall_us
            arrive = clock + comp
            for name, g in topo.groups.items():
                if g.kind != phase:
                    continue
                members = list(g.ranks)
                t_all = arrive[members].max()
                seq = seqs.get(name, 0)
                seqs[name] = seq + 1
                for r in members:
                    rows.append((it, r, "all_reduce", name, seq, 1 << 20, int(arrive[r] * 1e3),
                                 t_all - arrive[r] + XFER_US, " ".join(map(str, members)), -1,
                                 f"h{r // GPUS}", phase))
                    clock[r] = t_all + XFER_US
    cols = ["iteration", "rank", "op", "group", "seq", "nbytes", "start_ns", "duration_us",
            "group_ranks", "peer", "host", "group_kind"]
    return pd.DataFrame(rows, columns=cols)


CFG = LocalizeConfig(min_wait_us=50.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_host_pause_is_a_host_not_a_workload(seed: int) -> None:
    topo = _topology()
    ops = _ops(topo, seed, late_us=0.3 * COMPUTE_US, stall_host=1, stall_it=6,
               stall_us=15 * COMPUTE_US)
    verdict = analyze(ops, topo, model="rule", config=CFG)
    assert verdict.workload_findings == ()
    assert verdict.candidates, verdict
    top = verdict.candidates[0]
    assert top.kind == DeviceKind.HOST
    assert top.device == "host:h1"
    assert set(top.ranks) <= {4, 5, 6, 7}


@pytest.mark.parametrize("seed", [0, 1])
def test_lateness_in_every_step_is_still_a_workload(seed: int) -> None:
    # Same job without the pause and with a heavier rotating late rank: persistent imbalance.
    topo = _topology()
    verdict = analyze(_ops(topo, seed, late_us=0.5 * COMPUTE_US), topo, model="rule", config=CFG)
    assert verdict.candidates == ()
    assert verdict.workload_findings
    assert verdict.workload_findings[0].kind == "rank-imbalance"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_irregular_steps_lateness_below_delta_is_not_a_suspect(seed: int) -> None:
    """Steps of 8 tp phases + 1 dp phase. Rank 6 is 3 ms late in 3 steps: its partners' waits
    are abnormal per op, but no step is delta-irregular and the delay is below (delta - 1) of a
    step -- within the user's tolerance (a loaded machine's scheduler does this). A rank late
    by more than that in every step (a slowdown older than the window, absorbed by the
    reference) is still named."""
    topo = _topology()
    sporadic = analyze(_ops(topo, seed, 0.0, slow_rank=6, slow_its=(2, 5, 9),
                            slow_us=0.3 * COMPUTE_US, tp_phases=8), topo, model="rule", config=CFG)
    assert sporadic.irregular_iterations == ()
    assert sporadic.stats["abnormal_rows"] > 0  # the detector did flag the waits
    assert sporadic.candidates == (), sporadic
    steady = analyze(_ops(topo, seed, 0.0, slow_rank=6, slow_its=tuple(range(12)),
                          slow_us=1.5 * COMPUTE_US, tp_phases=8), topo, model="rule", config=CFG)
    assert steady.irregular_iterations == ()
    assert [c.ranks for c in steady.candidates][:1] == [(6,)], steady
