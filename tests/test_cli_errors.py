"""The `holmes` shell: user mistakes end in one `error:` line (exit 2), `-v` shows the
traceback behind it, and the defaults work at any run length."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from holmes_ml.cli import app


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps at the console's width


def test_a_config_mistake_is_one_line_and_verbose_shows_the_traceback(tmp_path):
    args = ["demo", "--gpus", "64", "--iterations", "5", "--fault",
            "gpu_slow:rank=3,start=9", "--out", str(tmp_path / "s")]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2
    assert out.stderr.strip() == ("error: SimConfig.faults[0].start_iteration: got 9; "
                                  "expected < iterations (5)")
    out = CliRunner().invoke(app, ["-v", *args])
    assert out.exit_code == 2
    assert "Traceback (most recent call last)" in out.stderr
    assert out.stderr.rstrip().splitlines()[-1].startswith("error: SimConfig.faults[0]")


def test_an_existing_file_in_the_way_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    out = CliRunner().invoke(app, ["simulate", "--gpus", "64", "--iterations", "3", "--out",
                                   str(tmp_path / "f" / "sub")])
    assert out.exit_code == 2
    assert str(tmp_path / "f") in out.stderr and "Traceback" not in out.output


def test_a_fault_on_a_switch_or_link_the_job_lacks_is_refused(tmp_path):
    for device in ("link:foo", "link:leaf-p0-r2~spine-99"):
        out = CliRunner().invoke(app, ["simulate", "--gpus", "128", "--iterations", "4",
                                       "--fault", f"link_slow:device={device}",
                                       "--out", str(tmp_path / "s")])
        assert out.exit_code == 2, out.output
        assert f"got {device!r}; expected link:leaf-p{{pod}}-r{{rail}}~spine-{{s}}" in out.stderr
    out = CliRunner().invoke(app, ["simulate", "--gpus", "128", "--iterations", "4", "--fault",
                                   "link_slow:device=link:leaf-p0-r2~spine-3",
                                   "--out", str(tmp_path / "s")])
    assert out.exit_code == 0, out.output


def test_demo_with_a_short_run_starts_its_fault_inside_the_run(tmp_path):
    out = CliRunner().invoke(app, ["demo", "--gpus", "64", "--iterations", "6", "--out",
                                   str(tmp_path / "d")])
    assert out.exit_code == 0, out.output
    assert "top suspect" in out.stdout and (tmp_path / "d" / "verdict.json").exists()


def test_demo_says_when_its_first_suspect_is_tied(tmp_path):
    # In the default demo job one leaf-spine link carries nothing but the slow NIC's flows:
    # NIC and link fail alike, and the demo must say so rather than show two equal scores.
    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["demo", "--out", str(tmp_path / "d")])
    assert out.exit_code == 0, out.output
    first = json.loads((tmp_path / "d" / "verdict.json").read_text())["candidates"][0]
    assert first["tied_with"], first
    line = next(x for x in out.stdout.splitlines() if x.startswith("tied: suspect #1 and "))
    assert all(d in line for d in first["tied_with"]), line


def test_localize_says_when_a_slow_gpu_and_a_host_pause_look_alike(tmp_path):
    # Pure data parallelism: rank 5 meets its peers in two operators per step, so its one late
    # arrival per step may be its GPU or its host; the verdict names both and says why.
    sim = tmp_path / "dp"
    out = CliRunner().invoke(app, ["simulate", "--gpus", "16", "--model", "llama2-7b", "--tp",
                                   "1", "--pp", "1", "--iterations", "12", "--fault",
                                   "gpu_slow:rank=5,severity=0.5,start=3", "--out", str(sim),
                                   "--no-progress"])
    assert out.exit_code == 0, out.output
    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["localize", str(sim / "ops.parquet")])
    assert out.exit_code == 0, out.output
    text = _flat(out.stdout)
    said = text[text.index("tied: "):]
    assert said.startswith("tied: gpu:node000/5 and host:node000 (a pause of rank 5's host "
                           "process): rank 5 meets its peers too rarely"), said
    assert "check both" in said and "same slow flows" not in said


def test_version_and_short_help():
    from holmes_ml import __version__

    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and out.stdout.strip() == f"holmes_ml {__version__}"
    out = CliRunner().invoke(app, ["localize", "-h"])
    assert out.exit_code == 0 and "Examples" in _flat(out.stdout)


def _one_error_line(out) -> str:
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_a_negative_seed_is_refused_naming_the_option(tmp_path):
    for args in (["train", "--preset", "tiny", "--out", str(tmp_path / "m.holmes")],
                 ["simulate", "--gpus", "64", "--iterations", "3", "--out", str(tmp_path / "s")],
                 ["demo", "--gpus", "64", "--iterations", "6", "--out", str(tmp_path / "d")]):
        line = _one_error_line(CliRunner().invoke(app, [*args, "--seed", "-1"]))
        assert line == "error: --seed -1: expected an integer >= 0", (args, line)
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_a_delta_that_is_not_a_finite_factor_above_one_is_refused(tmp_path):
    from holmes_ml.simulator import SimConfig, simulate

    log = tmp_path / "ops.parquet"
    simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=4, seed=1)).ops.to_parquet(log)
    for args in (["detect", str(log), "--out", str(tmp_path / "s.parquet")],
                 ["localize", str(log)]):
        for delta in ("inf", "nan", "1", "0.5", "-2"):
            line = _one_error_line(CliRunner().invoke(app, [*args, "--delta", delta]))
            assert line.startswith(f"error: --delta {delta}: expected a finite factor > 1"), (
                args[0], line)
    assert not (tmp_path / "s.parquet").exists()


def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    # The logs named here do not exist: an output checked only after reading them (or after
    # training / simulating) would fail on them, or minutes later, instead.
    missing = str(tmp_path / "missing.parquet")
    a_file = tmp_path / "f"
    a_file.write_text("x")
    a_dir = tmp_path / "d"
    a_dir.mkdir()
    cases = [
        (["train", missing, "--out", "/dev/null/m.holmes"],
         "--out /dev/null/m.holmes: /dev/null is not a directory"),
        (["train", missing, "--out", str(a_file / "sub" / "m.holmes")],
         f"--out {a_file}/sub/m.holmes: {a_file} is not a directory"),
        (["train", missing, "--out", str(a_dir)], f"--out {a_dir}: is a directory"),
        (["detect", missing, "--out", str(a_dir)], f"--out {a_dir}: is a directory"),
        (["detect", missing, "--out", str(tmp_path / "s.parquet"), "--iterations-out",
          "/dev/null/i.csv"], "--iterations-out /dev/null/i.csv: /dev/null is not a directory"),
        (["localize", missing, "--graph", str(a_dir)], f"--graph {a_dir}: is a directory"),
        (["localize", missing, "--plot", str(a_file)],
         f"--plot {a_file}: exists and is not a directory"),
        # the graph written over the log it was read from, or over one of the plots
        (["localize", str(a_file), "--graph", str(a_file)],
         f"--graph {a_file}: would replace a file read from the input {a_file}"),
        (["localize", missing, "--plot", str(a_dir), "--graph", str(a_dir / "graph.png")],
         f"--graph {a_dir}/graph.png: is one of the plots --plot writes"),
        (["detect", missing, "--out", str(a_dir / "s.parquet"), "--iterations-out",
          str(a_dir / "s.parquet")], f"--iterations-out {a_dir}/s.parquet: the same file as --out"),
        (["detect", missing, "--out", str(a_dir / "s.csv")],
         f"--out {a_dir}/s.csv: a .csv name for a Parquet file"),
        (["simulate", "--gpus", "64", "--iterations", "3", "--out", str(a_file)],
         f"--out {a_file}: exists and is not a directory"),
        (["demo", "--gpus", "64", "--iterations", "6", "--out", str(a_file / "x")],
         f"--out {a_file}/x: {a_file} is not a directory"),
    ]
    for args, expected in cases:
        line = _one_error_line(CliRunner().invoke(app, args))
        assert line.startswith(f"error: {expected}"), (args, line)
        assert "expected a" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f"]


def _unwritable_dir(tmp_path):
    """A directory this user cannot write into: a read-only one, or (as root, who may write
    into any mode 0500 directory) a read-only mount such as /proc/sys; skip when none."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if not os.access(ro, os.W_OK):
        return ro
    if os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK):
        return Path("/proc/sys")
    pytest.skip("no unwritable directory: root, and no read-only mount at /proc/sys")


def test_an_output_in_an_unwritable_directory_is_refused_before_the_work(tmp_path):
    ro = _unwritable_dir(tmp_path)
    missing = str(tmp_path / "missing.parquet")
    for args, option in ((["detect", missing, "--out", str(ro / "s.parquet")], "--out"),
                         (["train", missing, "--out", str(ro / "new" / "m.holmes")], "--out"),
                         (["localize", missing, "--plot", str(ro / "plots")], "--plot")):
        line = _one_error_line(CliRunner().invoke(app, args))
        assert line.startswith(f"error: {option} {ro}/"), (args, line)
        assert f"directory {ro} is not writable; expected a path in a writable directory" \
            in line, (args, line)


def test_an_output_where_nothing_can_be_created_is_refused_before_the_work(tmp_path):
    # /proc takes no new file or directory (ENOENT), yet its mode lets root (and os.access)
    # write into it: the check passed, and --plot / --out failed only once the analysis was
    # done, in the words of mkdir or Arrow, without the option.
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    missing = str(tmp_path / "missing.parquet")
    a_dir = tmp_path / "d"
    (a_dir / "heatmap.png").mkdir(parents=True)
    out = str(tmp_path / "s.parquet")
    cases = [
        (["localize", missing, "--plot", "/proc/plots"], "--plot /proc/plots"),
        (["localize", missing, "--plot", "/proc/a/plots"], "--plot /proc/a/plots"),
        (["localize", missing, "--graph", "/proc/g.graphml"], "--graph /proc/g.graphml"),
        (["detect", missing, "--out", "/proc/x.parquet"], "--out /proc/x.parquet"),
        (["detect", missing, "--out", out, "--iterations-out", "/proc/i.csv"],
         "--iterations-out /proc/i.csv"),
        # an existing file root may not write either (/proc/version's mode says 0444)
        (["detect", missing, "--out", out, "--iterations-out", "/proc/version"],
         "--iterations-out /proc/version"),
    ]
    for args, said in cases:
        line = _one_error_line(CliRunner().invoke(app, args))
        assert line.startswith(f"error: {said}: "), (args, line)
        assert "; expected a" in line and "missing.parquet" not in line, (args, line)
    # a directory in the way of one of the plots, inside an existing --plot directory
    line = _one_error_line(CliRunner().invoke(app, ["localize", missing, "--plot", str(a_dir)]))
    assert line.startswith(f"error: --plot {a_dir}: {a_dir}/heatmap.png is a directory"), line
    assert "; expected" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert [p.name for p in a_dir.iterdir()] == ["heatmap.png"]


def test_check_writable_tries_the_directory_it_would_write_into(tmp_path):
    from holmes_ml.cli._checks import check_writable

    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    for path, directory in ((Path("/proc/x.parquet"), False), (Path("/proc/p"), True),
                            (Path("/proc/p/q/r.csv"), False)):
        with pytest.raises(ValueError, match=r"^--o /proc/\S+: directory /proc is not "
                           r"writable.*; expected a path in a writable directory$"):
            check_writable(path, "--o", directory=directory)
    # what may be written passes, and leaves nothing behind
    check_writable(tmp_path / "new" / "f.csv", "--o")
    check_writable(tmp_path / "dir", "--o", directory=True)
    check_writable(tmp_path, "--o", directory=True)
    (tmp_path / "f.csv").write_text("x")
    check_writable(tmp_path / "f.csv", "--o")
    assert [p.name for p in tmp_path.iterdir()] == ["f.csv"]
    assert (tmp_path / "f.csv").read_text() == "x"


def test_localize_set_overrides_a_setting_and_refuses_what_is_not_one(tmp_path):
    # refused before any log is read (the path does not even exist)
    missing = str(tmp_path / "nothing-here")
    cases = [
        (["--set", "late=1"], "--set late=1: no setting 'late'; expected one of"),
        (["--set", "window"], "--set 'window': expected KEY=VALUE"),
        (["--set", "late_fraction=half"], "--set late_fraction=half: expected a finite number"),
        (["--set", "late_fraction=2"], "LocalizeConfig.late_fraction: got 2.0; expected 0 <="),
        (["--set", "with_rule=maybe"], "--set with_rule=maybe: expected true or false"),
        (["--set", "window=1.5"], "--set window=1.5: expected an integer"),
        (["--set", "delta=1.2", "--delta", "1.05"], "--set delta: has its own option; "
         "expected --delta 1.2 instead"),
        (["--set", "top_k=2"], "--set top_k: has its own option; expected --top-k 2 instead"),
    ]
    for extra, expected in cases:
        line = _one_error_line(CliRunner().invoke(app, ["localize", missing, *extra]))
        assert line.startswith(f"error: {expected}"), (extra, line)
    # the settings listed are those --set takes (delta and top_k have options of their own)
    listed = _one_error_line(CliRunner().invoke(app, ["localize", missing, "--set", "late=1"]))
    listed = listed.split("expected one of ", 1)[1].split(", ")
    assert "late_fraction" in listed and "delta" not in listed and "top_k" not in listed
    # a real override changes the verdict: a healthy noisy ring read without a topology, its
    # detector's threshold lowered to 0.1 (tests/test_localize_false_alarms.py), names a NIC
    # once the quiet-window rule is off
    from holmes_ml.io.schema import without_labels
    from holmes_ml.simulator import SimConfig, simulate

    sim = simulate(SimConfig(gpus=256, model="mixtral-8x7b", tp=2, pp=2, ep=2, cp=2,
                             iterations=10, seed=7300, jitter=0.06, drift=0.1, comm_drift=0.2))
    log = tmp_path / "ops.parquet"
    without_labels(sim.ops).to_parquet(log)
    more = ["--set", "score_threshold=0.1"]
    plain = json.loads(CliRunner().invoke(app, ["localize", str(log), "--json", *more]).stdout)
    loose = json.loads(CliRunner().invoke(
        app, ["localize", str(log), "--json", *more, "--set", "quiet_persistence=0"]).stdout)
    assert plain["candidates"] == [] and loose["candidates"][0]["kind"] == "nic"


def test_demo_refuses_an_empty_job_and_gives_one_host_a_fault_it_can_show(tmp_path):
    line = _one_error_line(CliRunner().invoke(app, ["demo", "--gpus", "0", "--out",
                                                    str(tmp_path / "d0")]))
    assert line.startswith("error: SimConfig.gpus: got 0; expected an integer of at least 2"), \
        line
    # one host: no traffic leaves it, so the demo draws no slow NIC (seed 0 drew one)
    for seed in range(3):
        out = CliRunner().invoke(app, ["demo", "--gpus", "8", "--iterations", "9", "--seed",
                                       str(seed), "--out", str(tmp_path / f"d{seed}")])
        assert out.exit_code == 0, out.output
        truth = json.loads((tmp_path / f"d{seed}" / "faults.json").read_text())
        assert truth[0]["kind"] != "nic_slow", truth


@pytest.mark.parametrize(("args", "expected"), [
    (["localize", "x", "--top-k", "0"],
     "error: Invalid value for '--top-k': Input should be greater than or equal to 1 (see "
     "'holmes localize -h')"),
    (["simulate", "--gpus", "12", "--out", "never-written"],
     "error: Invalid value: --gpus: got 12; expected a multiple of 8"),  # the option typed
    (["localize", "x", "--bogus"], "error: No such option: --bogus (see 'holmes localize -h')"),
    # before any reading (it said "error: format: not a known format" once reading began)
    *[([cmd, "x", "--format", "foo"], "error: Invalid value for '--format': 'foo'; expected "
       "auto, native, kineto, flight-recorder, nccl-inspector or bytedance (see 'holmes "
       f"{cmd} -h')") for cmd in ("localize", "detect", "check", "train")],
    (["bench", "localize", "--localizer", "no_such_mod_here:fn"],
     "error: Invalid value for --localizer: 'no_such_mod_here:fn': cannot import it (No module "
     "named 'no_such_mod_here'); a module of your own must be importable: put its directory on "
     "PYTHONPATH (PYTHONPATH=. holmes bench ...) or install it (see 'holmes bench -h')"),
    # before the hour of training, and not ignored by a bench it does not apply to
    (["bench", "detector", "--method", "forest"],
     "error: Invalid value for --method: 'forest': not a method of bench detector; expected "
     "one or more of lgbm, lgbm-absolute, lgbm-small, rf, tuned-lgbm, 3sigma, knn, svm, "
     "iforest (repeat the option) (see 'holmes bench -h')"),
    (["bench", "localize", "--method", "rf"],
     "error: Invalid value for --method: --method does not apply to bench localize; it "
     "applies to detector"),
])
def test_a_usage_error_is_one_line_from_the_console_script(args, expected):
    """What click reports itself (an option out of range, an unknown option) is one error
    line with exit status 2 too, not its boxed usage text."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'holmes'; "
                           "from holmes_ml.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(expected), proc.stderr


def test_a_topology_or_model_that_is_no_regular_file_is_named(tmp_path):
    # a FIFO would block the read forever, /dev/zero never end it; a loop of links and a
    # directory failed with an error naming neither the option nor what was expected
    from holmes_ml.simulator import SimConfig, simulate

    job = tmp_path / "job"
    simulate(SimConfig(gpus=16, model="llama2-7b", tp=2, pp=2, iterations=4, seed=3)).write(job)
    log = str(job / "ops.parquet")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    expected = "a topology.json as holmes simulate writes it"
    for path, what in [(fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file"),
                       (tmp_path, "a directory, not a file"), (tmp_path / "loop", "cannot open")]:
        line = _one_error_line(CliRunner().invoke(app, ["localize", log, "--topology",
                                                        str(path)]))
        assert line.startswith(f"error: {path}: {what}") and expected in line, line
    for path, what in [(fifo, "not a regular file"), (tmp_path, "a directory, not a model")]:
        line = _one_error_line(CliRunner().invoke(app, ["localize", log, "--model", str(path)]))
        assert line.startswith(f"error: {path}: {what}"), line


def test_a_topology_lacking_ranks_of_the_logs_is_named_by_its_file(tmp_path):
    from holmes_ml.simulator import SimConfig, simulate

    job = tmp_path / "job"
    simulate(SimConfig(gpus=16, model="llama2-7b", tp=2, pp=2, iterations=4, seed=3)).write(job)
    small = tmp_path / "small"
    simulate(SimConfig(gpus=8, model="llama2-7b", tp=2, pp=2, iterations=4, seed=3)).write(small)
    top = small / "topology.json"
    line = _one_error_line(CliRunner().invoke(app, ["localize", str(job / "ops.parquet"),
                                                    "--topology", str(top)]))
    assert line.startswith(f"error: {top}: the logs have 8 rank(s) the topology does not "
                           "place"), line


def test_demo_says_how_its_first_suspect_compares_with_the_injected_fault():
    # it compared ranks only: another device on the fault's ranks (the link above a slow NIC)
    # read as "matches", a tie holding the fault as a miss or a hit alike
    from types import SimpleNamespace

    from holmes_ml.cli.demo import _match_line

    truth = {"devices": ["nic:node004/6"], "ranks": [38]}

    def top(device, ranks=(38,), tied=()):
        return SimpleNamespace(device=device, ranks=ranks, tied_with=tied)

    assert "matches the injected fault" in _match_line(top("nic:node004/6"), truth)
    assert "among the devices tied" in _match_line(
        top("link:leaf-p1-r6~spine-0", tied=("nic:node004/6",)), truth)
    line = _match_line(top("link:leaf-p1-r6~spine-0", ranks=(38, 46)), truth)
    assert "is on the injected fault's ranks, but is not its device (nic:node004/6)" in line
    assert "does not match" in _match_line(top("gpu:node000/1", ranks=(1,)), truth)
    assert "no device blamed" in _match_line(None, truth)


def test_a_drawn_network_fault_that_would_slow_nothing_is_refused(tmp_path):
    # one 8-GPU host: no traffic leaves it, so a drawn NIC or switch would be a silent no-op
    for fault in ("nic_slow", "switch_congested:start=2"):
        out = CliRunner().invoke(app, ["simulate", "--gpus", "8", "--iterations", "4",
                                       "--fault", fault, "--out", str(tmp_path / "s")])
        assert out.exit_code == 2, out.output
        kind = fault.split(":")[0]
        assert f"faults[0] {kind}: no traffic of this job leaves its hosts" in _flat(out.stderr)
    # pinned by the user too: a "faulty" job whose logs cannot show the fault, labelled with
    # nothing abnormal, was written with only a warning
    out = CliRunner().invoke(app, ["simulate", "--gpus", "8", "--iterations", "4", "--fault",
                                   "nic_slow:rank=3", "--out", str(tmp_path / "p")])
    assert out.exit_code == 2, out.output
    assert "faults[0] nic_slow: no traffic of this job crosses nic:node000/3" in _flat(out.stderr)


@pytest.mark.parametrize(("fault", "says"), [
    ("nic_slow:device=nic:nodeXYZ", "device id 'nic:nodeXYZ': expected nic:HOST/INDEX"),
    ("gpu_slow:device=gpu:node001", "device id 'gpu:node001': expected gpu:HOST/INDEX"),
    ("host_stall:device=host:node001/3", "expected host:HOST (a whole host, no /INDEX; "
                                         "gpu:node001/3 names one GPU)"),
])
def test_a_malformed_device_id_says_what_a_device_id_looks_like(tmp_path, fault, says):
    out = CliRunner().invoke(app, ["simulate", "--gpus", "64", "--iterations", "4", "--fault",
                                   fault, "--out", str(tmp_path / "s")])
    assert out.exit_code == 2, out.output
    assert says in _flat(out.stderr) and "invalid literal" not in out.stderr


def test_a_data_parallel_size_that_does_not_fit_says_so():
    from holmes_ml.simulator import SimConfig

    with pytest.raises(ValueError, match=r"= 12 GPUs; expected exactly gpus=64 \(drop dp to "
                                         r"derive it, or give dp=16\)"):
        SimConfig(gpus=64, model="llama2-7b", tp=2, pp=2, dp=3).layout  # noqa: B018


def test_python_dash_m_runs_the_holmes_command():
    import subprocess
    import sys

    for module in ("holmes_ml", "holmes_ml.cli"):
        out = subprocess.run([sys.executable, "-m", module, "simulate", "--help"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "--fault" in out.stdout


def test_format_help_names_every_format_at_80_columns():
    """One `auto|native|...` token was cut short by a narrow terminal; words wrap."""
    from holmes_ml.io import FORMATS

    for cmd in ("localize", "detect", "check", "train"):
        out = CliRunner().invoke(app, [cmd, "--help"], terminal_width=80).output
        text = " ".join(line.strip("│ ") for line in out.splitlines())
        assert all(f in text for f in FORMATS), (cmd, out)
        assert "…" not in out.split("--format", 1)[1].split("--", 1)[0], (cmd, out)

