"""The two agent losses the closing note of stop 59 quotes, measured so that they can be run
against another checkout (``PYTHONPATH=<checkout> python scripts/agent_catch_up_check.py``):

* ``once``: ``holmes agent --once`` over logs longer than a chunk (the chunk made 4 KiB here,
  so that a 2-rank, 12-iteration job's logs take several): how many of the logs' operators
  reach the outbox;
* ``downtime``: the agent stops; rank 0's log gains rows, is renamed to ``rank0.jsonl.1``,
  gains more there, and its writer opens a new ``rank0.jsonl``; a new agent on the same outbox
  runs ``--once``: how many operators reach the outbox over both runs.

No service is needed: the batches are counted in the outbox (operators per iteration and rank,
the latest batch of each).
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import holmes_ml.serve.agent as agent_module
from holmes_ml.serve.agent import Agent, AgentConfig


def _job(ranks: int = 2, iterations: int = 12, per: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    it, rk, sq = np.meshgrid(np.arange(iterations), np.arange(ranks), np.arange(per),
                             indexing="ij")
    it, rk, sq = it.ravel(), rk.ravel(), sq.ravel()
    seq = it * per + sq
    return pd.DataFrame({
        "iteration": it, "rank": rk, "op": "all_reduce", "group": "dp-0", "seq": seq,
        "nbytes": 1 << 20, "start_ns": 10**18 + seq * 10**7 + rk * 1000,
        "duration_us": rng.gamma(4.0, 100.0, len(it)),
        "group_ranks": " ".join(map(str, range(ranks))), "group_kind": "dp", "peer": -1,
        "host": "node000"})


def _agent(logs: Path, outbox: Path, history: int = 10) -> Agent:
    cfg = AgentConfig(follow=logs, server="http://127.0.0.1:9", job="check", source="n1",
                      outbox=outbox, once_retry_s=0, history=history)
    return Agent(cfg, model="rule")


def _shipped(outbox: Path) -> int:
    latest: dict[tuple[int, int], int] = {}
    with sqlite3.connect(outbox) as db:
        for (body,) in db.execute("SELECT body FROM outbox ORDER BY seq"):
            its = json.loads(gzip.decompress(body))["iterations"]
            for i, r, n in zip(its["iteration"], its["rank"], its["n_ops"], strict=True):
                latest[(i, r)] = n
    return sum(latest.values())


def _lines(df: pd.DataFrame) -> str:
    return df.to_json(orient="records", lines=True)


def once(tmp: Path) -> str:
    agent_module._MAX_CHUNK, agent_module._MIN_CHUNK = 4096, 1024
    ops = _job()
    logs = tmp / "once"
    logs.mkdir()
    for r, sub in ops.groupby("rank"):
        (logs / f"rank{r}.jsonl").write_text(_lines(sub))
    agent = _agent(logs, tmp / "once.db")
    agent.run(once=True)
    agent.close()
    return f"once: {_shipped(tmp / 'once.db')} of {len(ops)} operators queued"


def downtime(tmp: Path) -> str:
    ops = _job()
    logs = tmp / "down"
    logs.mkdir()
    r0, r1 = (ops[ops["rank"] == r] for r in (0, 1))
    (logs / "rank1.jsonl").write_text(_lines(r1))
    log = logs / "rank0.jsonl"
    fh = log.open("w")
    agent = _agent(logs, tmp / "down.db", history=1)
    for i in range(7):  # a live log: one iteration a poll
        fh.write(_lines(r0[r0["iteration"] == i]))
        fh.flush()
        agent.read_new()
        agent.queue_ready()
    agent.close()  # no agent runs from here
    fh.write(_lines(r0[r0["iteration"] == 7]))
    fh.flush()
    log.rename(logs / "rank0.jsonl.1")
    fh.write(_lines(r0[r0["iteration"] == 8]))  # to the renamed file
    fh.close()
    log.write_text(_lines(r0[r0["iteration"] >= 9]))  # the writer opens the name anew
    agent = _agent(logs, tmp / "down.db", history=1)
    agent.run(once=True)
    agent.close()
    return f"downtime: {_shipped(tmp / 'down.db')} of {len(ops)} operators queued"


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)  # (the service is not there: retries are not the point)
    with tempfile.TemporaryDirectory() as tmp:
        print(downtime(Path(tmp)))
        print(once(Path(tmp)))
