"""``holmes bench follow`` at a tiny size: every row the logs gained is read by the agent, in
every format, a restarted agent reads on from its kept points, and the figures and tables are
all there (timings are the benchmark's business, not a test's)."""

from __future__ import annotations

import math

from holmes_ml.bench import BENCHMARKS, follow
from holmes_ml.serve.agent import AgentConfig

#: the context an agent keeps by default (iterations), and polls enough that a restarted
#: agent finds a kept point before the last one
HISTORY = AgentConfig.history
POLLS = HISTORY + 4 + HISTORY % 2  # even (14 for a history of 10): rotations every 2 polls
ROTATIONS = (POLLS - 2) // 2


def test_follow_bench_reads_every_row_of_every_format():
    assert BENCHMARKS["follow"] == "holmes_ml.bench.follow:run"
    result = follow.run(polls=POLLS, rows=40)
    f = result.figures
    for fmt in ("arrow", "jsonl", "csv"):
        for what in ("read_ms_first", "read_ms_last", "read_growth", "read_us_per_row", "mb"):
            assert math.isfinite(f[f"{fmt}_{what}"]) and f[f"{fmt}_{what}"] > 0, (fmt, what)
        # the agent read each poll's rows, once
        assert result.details[fmt]["rows"] == [40 * follow.RANKS] * POLLS
        # restarted: every log read on from a kept point (the watermark is POLLS - 2 after the
        # last poll, and the next batch needs the HISTORY iterations before it), or from its
        # start
        assert f[f"{fmt}_restart_rows"] == (HISTORY + 1) * 40 * follow.RANKS
        assert f[f"{fmt}_restart_from_start_rows"] == POLLS * 40 * follow.RANKS
    assert f["arrow_reread_ms_last"] > 0
    assert len(result.details["arrow"]["reread_s"]) == POLLS
    restarts = result.tables["a restarted agent catching up"]
    # (the rotated logs began 2 iterations ago: no point of theirs qualifies yet)
    assert [(r["format"], r["logs read on from a point"]) for r in restarts] == [
        (fmt, n if fmt != "rotated" else 0) for n in (follow.RANKS, 0)
        for fmt in ("arrow", "jsonl", "csv", "rotated")]
    assert f["peak_rss_mb_after_restarts_from_points"] > 0
    assert f["peak_rss_mb_after_restarts_from_start"] > 0
    table = result.tables["one agent poll as the logs grow"]
    assert [row["format"] for row in table] == [
        "arrow", "arrow, read whole at every poll", "jsonl", "csv",
        "jsonl, rotated and compressed every 2 polls: other polls",
        "jsonl, rotated and compressed every 2 polls: polls finding new archives"]
    # rotated and compressed every other poll: each archive is read once, and its rows (read
    # already as the logs grew) are not counted again; every iteration was queued (the bench
    # checks the watermarks)
    rotated = result.details["rotated"]
    assert rotated["rows"] == [40 * follow.RANKS] * POLLS
    assert f["rotated_archives"] == ROTATIONS * 8
    assert len(rotated["rotated_s"]) == ROTATIONS and len(rotated["read_s"]) == POLLS - ROTATIONS
    for what in ("read", "rotation"):
        assert f[f"rotated_{what}_ms_last"] > 0 and f[f"rotated_{what}_growth"] > 0
    # restarted, the rows of the context the next batch needs are read (from the archives
    # that hold them and the logs begun since): an archive's rows queued already and older
    # than that are dropped, not counted, whether it was read again or not
    assert (f["rotated_restart_rows"] == f["rotated_restart_from_start_rows"]
            == (HISTORY + 1) * 40 * 8)
    assert f["read_points_5760_archives_ms_first"] > 0
    assert f["read_points_5760_archives_ms_next"] > 0
    assert f["idle_poll_5760_archives_ms"] > 0 and f["first_read_960_archives_s"] > 0
    assert result.config["polls"] == POLLS and result.config["rows_per_rank_per_poll"] == 40
    # a new agent with --since on the rotated logs, their archives two days old: it reads the
    # live logs (the last 2 iterations) and leaves every archive out
    assert (f["rotated_since_rows"], f["rotated_since_files_left_out"]) == (2 * 40 * 8,
                                                                            ROTATIONS * 8)
    assert f["rotated_since_s"] > 0
