"""`holmes localize` end to end: outputs checked before the work, and `--iterations A:B`
slices that say when they leave the irregularity monitor nothing to judge against."""

from __future__ import annotations

import json
import os
import re

import pytest
from test_serve_cli import on_a_terminal
from typer.testing import CliRunner

from holmes_ml.cli import app
from holmes_ml.features import IrregularityConfig


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())  # rich wraps and boxes at the console's width


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """16 GPUs, 40 iterations, rank 3 slow from iteration 28 to the end."""
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    out = tmp_path_factory.mktemp("localize") / "sim"
    simulate(SimConfig(gpus=16, iterations=40, seed=3,
                       faults=(FaultSpec.parse("gpu_slow:rank=3,start=28"),))).write(out)
    return out


def _wide(args: list[str]):
    """``holmes`` run with the verdict's lines unwrapped (rich reads COLUMNS)."""
    return CliRunner(env={"COLUMNS": "400"}).invoke(app, args, terminal_width=400)


def _one_error_line(out) -> str:
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and out.stdout == "", out.output
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_an_unwritable_plot_or_graph_is_refused_before_the_logs_are_read(sim, tmp_path):
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    # the analysis used to run to its end, then fail with "error: /proc/plots: No such file
    # or directory" (the option unnamed)
    for args, said in ((["--plot", "/proc/plots"], "--plot /proc/plots"),
                       (["--graph", "/proc/e.graphml"], "--graph /proc/e.graphml"),
                       (["--plot", str(tmp_path / "p"), "--graph", "/proc/e.graphml"],
                        "--graph /proc/e.graphml")):
        line = _one_error_line(CliRunner().invoke(app, ["localize", str(sim), *args]))
        assert line.startswith(f"error: {said}: directory /proc is not writable"), line
        assert line.endswith("; expected a path in a writable directory"), line
    assert not any(tmp_path.iterdir())


def test_help_says_where_a_slice_must_start_and_what_a_slice_is():
    shown = _flat(CliRunner().invoke(app, ["localize", "--help"], terminal_width=400).output)
    window = IrregularityConfig().window
    assert f"Start A at least {window} iterations before the episode" in shown, shown
    assert f"judges each iteration against up to {window} regular ones before it" in shown
    assert "A:A is iteration A alone" in shown


@pytest.mark.parametrize("given", ["5", " 7 "])
def test_a_lone_number_is_refused_as_ambiguous(given, tmp_path):
    missing = str(tmp_path / "missing.parquet")  # refused before any reading
    line = _one_error_line(CliRunner().invoke(app, ["localize", missing, "--iterations", given]))
    n = given.strip()
    assert line.startswith(f"error: --iterations {given}: one number"), line
    assert f"expected A:B (both included), e.g. {n}: for iteration {n} onwards or {n}:{n} " \
        "for it alone" in line, line


def test_iteration_range_reads_both_sides_and_one_iteration_as_a_to_a():
    from holmes_ml.cli._checks import iteration_range

    assert iteration_range("20:40") == (20, 40)
    assert iteration_range("7:7") == (7, 7)
    assert iteration_range("41:") == (41, None) and iteration_range(":3") == (None, 3)
    for bad in ("7", "40:20", ":", "a:b", "-1:3"):
        with pytest.raises(ValueError, match=rf"^--iterations {re.escape(bad)}: "):
            iteration_range(bad)


def test_a_slice_starting_inside_the_slowdown_says_to_widen_it(sim):
    # 32:39 lies inside the slowdown (28-39): judged against itself, no iteration of it is
    # irregular, and the note blamed "a slowdown present since the log began"
    out = _wide(["localize", str(sim), "--iterations", "32:39"])
    assert out.exit_code == 0, out.output
    assert "irregular iterations: none" in out.stdout
    hint = [ln for ln in out.stdout.splitlines() if ln.startswith("note: --iterations 32:39")]
    assert len(hint) == 1, out.stdout
    assert "no regular iterations before it to judge against" in hint[0], hint
    assert hint[0].endswith("(holmes localize --iterations 12:39)"), hint
    # the same in the JSON verdict's note
    body = json.loads(CliRunner().invoke(app, ["localize", str(sim), "--iterations", "32:39",
                                               "--json"]).stdout)
    assert body["irregular_iterations"] == []
    assert body["note"].endswith("(holmes localize --iterations 12:39)"), body["note"]
    # the widened slice sees the episode, and says nothing more
    out = CliRunner().invoke(app, ["localize", str(sim), "--iterations", "12:39", "--json"])
    body = json.loads(out.stdout)
    assert 28 in body["irregular_iterations"], body
    assert "--iterations 12:39" not in (body["note"] or "")


def test_the_widened_slice_stops_at_the_first_iteration_logged_and_keeps_an_open_end(sim):
    out = _wide(["localize", str(sim), "--iterations", "30:"])
    assert out.exit_code == 0, out.output
    assert "(holmes localize --iterations 10:)" in _flat(out.stdout), out.stdout
    out = _wide(["localize", str(sim), "--iterations", "6:39"])
    if "irregular iterations: none" in out.stdout:  # (rank 3 is slow from 28 on)
        pytest.fail(out.stdout)
    flat = _flat(_wide(["localize", str(sim), "--iterations", "6:39", "--delta", "100"]).stdout)
    assert "(holmes localize --iterations 0:39)" in flat, flat


def test_no_widening_is_asked_for_when_the_slice_cut_nothing_before_it(sim):
    for given in ("0:39", ":39"):
        out = _wide(["localize", str(sim), "--iterations", given, "--delta", "100"])
        assert out.exit_code == 0, out.output
        assert "irregular iterations: none" in out.stdout
        assert "to judge against" not in out.stdout, out.stdout


def test_on_a_terminal_each_long_stage_says_what_runs_and_is_cleared(sim, tmp_path):
    """After the files' progress bar, a job of thousands of rank logs left a terminal silent
    for seconds (checking the files together, scoring, localizing, taking stock): each stage
    now shows what runs on a line of its own, cleared before the verdict is printed; piped,
    nothing of it."""
    import pandas as pd

    logs = tmp_path / "logs"
    logs.mkdir()
    ops = pd.read_parquet(sim / "ops.parquet")
    for r, sub in ops.groupby("rank"):
        sub.to_csv(logs / f"rank-{r}.csv", index=False)
    status, raw = on_a_terminal("localize", logs, "--top-k", "1")
    assert status == 0, raw
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", raw)  # (the terminal's codes left out)
    stages = [f"checking {ops['rank'].nunique()} files against each other",
              f"scoring {len(ops):,} operators", "localizing"]
    at = [text.find(s) for s in stages]
    assert all(a >= 0 for a in at) and at == sorted(at), (at, text)
    verdict = text.find("suspects (best first)")
    assert verdict > at[-1], text
    # cleared: the last stage's line is erased (ESC [2K) before the verdict is printed
    last = raw.rfind("localizing")
    assert "\x1b[2K" in raw[last:raw.find("suspects (best first)")], raw[last:]
    assert "gpu" in text[verdict:], text
    # holmes detect likewise, while it scores
    status, raw = on_a_terminal("detect", logs, "--out", tmp_path / "s.parquet")
    assert status == 0 and f"scoring {len(ops):,} operators" in raw, raw
    # holmes check while it takes stock of what it read, erased before its report
    status, raw = on_a_terminal("check", logs)
    assert status == 0, raw
    said = raw.find(f"taking stock of {len(ops):,} operators")
    report = raw.find("read ", said)  # (its figures are coloured: codes between the words)
    assert 0 <= said < report and "\x1b[2K" in raw[said:report], raw
    piped = CliRunner().invoke(app, ["localize", str(logs), "--top-k", "1"])
    assert piped.exit_code == 0 and not any(s.split()[0] in piped.stderr for s in stages), \
        piped.stderr
    piped = CliRunner().invoke(app, ["check", str(logs)])
    assert piped.exit_code == 0 and "taking stock" not in piped.stderr, piped.stderr
