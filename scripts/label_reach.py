"""How much of the simulator's labels can an operator log show at all?

The simulator marks an operator copy ``affected`` when the fault prolonged it by more than
15 % + 20 us against the same job simulated without the fault (its *twin*), and ``abnormal`` when
it is affected and also longer than the twin's copies of the same op step usually are (median +
3 robust standard deviations). This script re-simulates 30 held-out jobs (256 / 512 / 1,024
GPUs x five fault kinds x persistent / spike, 16 iterations, the mix the detector's weak
scales come from) and counts, for each label, the positive copies that are no longer than the
same operator - same rank, communicator, op, position in the iteration and size - runs at some
iteration of the fault-free twin (``inside``: such a copy looks normal in its own history),
and those no longer than the longest fault-free copy of the same op step on the same pipeline
stage in the same iteration (``inside_step``: such a copy looks like one of its step's
ordinary waits, however much longer the fault made it).

The twin's durations are internal to the engine; the script wraps ``Engine._frame`` to keep
them as ``clean_duration_us``, ``clean_step_max_us`` and ``clean_step_usual_us`` (the label's
ceiling) columns (an analysis hook, not part of the simulator's output).

Usage: ``.venv/bin/python scripts/label_reach.py`` (about 20 s on 2 cores); prints, per fault
kind and per communicator kind, each label's positives and the shares inside either range.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from holmes_ml.simulator import FaultSpec, SimConfig, simulate
from holmes_ml.simulator.engine import Engine, _usual_ceiling

KINDS = ("gpu_slow", "nic_slow", "link_slow", "switch_congested", "host_stall")
_frame = Engine._frame


def _frame_with_twin(self, it, out):
    frame = _frame(self, it, out)
    frame["clean_duration_us"] = np.concatenate([c.dur0 for c in out])
    # one chunk = one op step on one pipeline stage (every rank of the stage)
    frame["clean_step_max_us"] = np.repeat([float(np.max(c.dur0)) for c in out],
                                           [len(c.ranks) for c in out])
    # how long those copies usually are: the label's ceiling
    frame["clean_step_usual_us"] = np.repeat([_usual_ceiling(c.dur0) for c in out],
                                             [len(c.ranks) for c in out])
    return frame


def invisible(ops: pd.DataFrame) -> np.ndarray:
    """Per copy: no longer than its signature's longest twin duration."""
    key = pd.DataFrame({"it": ops["iteration"], "r": ops["rank"],
                        "g": ops["group"].cat.codes, "seq": ops["seq"]})
    pos = key.sort_values("seq").groupby(["it", "r", "g"]).cumcount().reindex(key.index)
    sig = [ops["rank"], ops["group"].cat.codes, ops["op"].cat.codes, pos, ops["nbytes"]]
    longest_clean = ops["clean_duration_us"].groupby(sig).transform("max").to_numpy()
    return ops["duration_us"].to_numpy() <= longest_clean


LABELS = ("affected", "abnormal")


RANGES = ("inside", "inside_step")


def _table(df: pd.DataFrame, by: str) -> str:
    cols = [f"{label}{suffix}" for label in LABELS for suffix in ("", *(f"_{r}" for r in RANGES))]
    out = df.groupby(by)[cols].sum()
    out.loc["all"] = out.sum()
    for label in LABELS:
        for r in RANGES:
            out[f"{label}_share_{r}"] = (out[f"{label}_{r}"] / out[label]).round(3)
    return out[[c for c in out.columns if "share" in c or c in LABELS]].to_string()


def main() -> None:
    Engine._frame = _frame_with_twin
    parts = []
    for si, gpus in enumerate((256, 512, 1024)):
        for ki, kind in enumerate(KINDS):
            for pi, pattern in enumerate(("persistent", "spike")):
                cfg = SimConfig(gpus=gpus, iterations=16, seed=500 + 100 * si + 10 * ki + pi,
                                model="llama2-70b" if pi == 0 else "llama2-7b",
                                faults=(FaultSpec(kind=kind, severity=0.5, pattern=pattern,
                                                  start_iteration=5),))
                ops = simulate(cfg).ops
                inside = {"inside": invisible(ops),
                          "inside_step": (ops["duration_us"] <= ops["clean_step_max_us"])
                          .to_numpy()}
                cols = {"kind": kind, "group_kind": ops["group_kind"].astype(str)}
                for label in LABELS:
                    y = ops[label].to_numpy(bool)
                    cols[label] = y
                    for r in RANGES:
                        cols[f"{label}_{r}"] = y & inside[r]
                parts.append(pd.DataFrame(cols).groupby(["kind", "group_kind"],
                                                        as_index=False).sum())
    df = pd.concat(parts, ignore_index=True)
    print(_table(df, "kind"), end="\n\n")
    print(_table(df, "group_kind"))


if __name__ == "__main__":
    main()
