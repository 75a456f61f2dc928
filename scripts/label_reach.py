"""How much of the simulator's ``abnormal`` label can an operator log show at all?

The simulator labels an operator copy abnormal when the fault prolonged it by more than 15 % +
20 us against the same job simulated without the fault (its *twin*). This script re-simulates
30 held-out jobs (256 / 512 / 1,024 GPUs x five fault kinds x persistent / spike, 16 iterations,
the mix the detector's weak scales come from) and counts the abnormal copies that are no longer
than the same operator - same rank, communicator, op, position in the iteration and size - runs
at some iteration of the fault-free twin. Such a copy looks normal in every log; no detector can
flag it from durations.

The twin's durations are internal to the engine; the script wraps ``Engine._frame`` to keep
them as a ``clean_duration_us`` column (an analysis hook, not part of the simulator's output).

Usage: ``.venv/bin/python scripts/label_reach.py`` (about 20 s on 2 cores); prints the share
per fault kind and per communicator kind, and the total.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from holmes_ml.simulator import FaultSpec, SimConfig, simulate
from holmes_ml.simulator.engine import Engine

KINDS = ("gpu_slow", "nic_slow", "link_slow", "switch_congested", "host_stall")
_frame = Engine._frame


def _frame_with_twin(self, it, out):
    frame = _frame(self, it, out)
    frame["clean_duration_us"] = np.concatenate([c.dur0 for c in out])
    return frame


def invisible(ops: pd.DataFrame) -> np.ndarray:
    """Per copy: abnormal, yet no longer than its signature's longest twin duration."""
    key = pd.DataFrame({"it": ops["iteration"], "r": ops["rank"],
                        "g": ops["group"].cat.codes, "seq": ops["seq"]})
    pos = key.sort_values("seq").groupby(["it", "r", "g"]).cumcount().reindex(key.index)
    sig = [ops["rank"], ops["group"].cat.codes, ops["op"].cat.codes, pos, ops["nbytes"]]
    longest_clean = ops["clean_duration_us"].groupby(sig).transform("max").to_numpy()
    return ops["abnormal"].to_numpy(bool) & (ops["duration_us"].to_numpy() <= longest_clean)


def _table(df: pd.DataFrame, by: str) -> str:
    out = df.groupby(by)[["abnormal", "inside_clean_range"]].sum()
    out.loc["all"] = out.sum()
    out["share"] = (out["inside_clean_range"] / out["abnormal"]).round(3)
    return out.to_string()


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
                parts.append(pd.DataFrame({
                    "kind": kind, "group_kind": ops["group_kind"].astype(str),
                    "abnormal": ops["abnormal"].to_numpy(bool),
                    "inside_clean_range": invisible(ops),
                }).groupby(["kind", "group_kind"], as_index=False).sum())
    df = pd.concat(parts, ignore_index=True)
    print(_table(df, "kind"), end="\n\n")
    print(_table(df, "group_kind"))


if __name__ == "__main__":
    main()
