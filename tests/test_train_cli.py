"""`holmes train PATH...` re-trains a detector on labelled logs and saves a checked envelope."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pandas as pd
import pytest
from test_cli_errors import _one_error_line
from typer.testing import CliRunner

from holmes_ml.cli import app
from holmes_ml.io import without_labels
from holmes_ml.models import load_model, read_header
from holmes_ml.simulator import FaultSpec, SimConfig, simulate


@pytest.mark.parametrize("estimator", ["rf", "lgbm-small"])
def test_train_on_labelled_logs_then_load(tmp_path, estimator):
    cfg = SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=14, seed=11,
                    faults=(FaultSpec.parse("gpu_slow:rank=3,severity=0.8,start=5"),))
    res = simulate(cfg)
    res.write(tmp_path / "sim")
    out = tmp_path / "m.holmes"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "sim" / "ops.parquet"),
                                      "--estimator", estimator, "--out", str(out)])
    assert result.exit_code == 0, result.output
    header = read_header(out)
    assert header["metrics"]["train_rows"] > 0
    model = load_model(out)
    from holmes_ml.features import build_features

    scores = model.decision_function(build_features(res.ops))
    y = res.ops["abnormal"].to_numpy(bool)
    # trained on these very logs: abnormal ops must score above normal ones on average
    assert scores[y].mean() > scores[~y].mean() + 0.3


def test_train_refuses_unlabelled_logs(tmp_path):
    res = simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=6, seed=1))
    path = tmp_path / "ops.csv"
    without_labels(res.ops).to_csv(path, index=False)
    result = CliRunner().invoke(app, ["train", str(path), "--out", str(tmp_path / "m.holmes")])
    assert _one_error_line(result).startswith(
        f"error: {path}, column 'abnormal': missing; training needs op-level labels")


def test_train_unknown_estimator_lists_choices(tmp_path):
    result = CliRunner().invoke(app, ["train", "--estimator", "xgb", "--out",
                                      str(tmp_path / "m.holmes")])
    assert result.exit_code != 0
    assert "'xgb'" in result.output and "lgbm-small" in result.output


def test_train_reads_a_simulator_directory_and_refuses_one_class(tmp_path):
    cfg = SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=12,
                    faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.8,start=4"),))
    simulate(cfg).write(tmp_path / "sim")
    out = tmp_path / "m.holmes"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "sim"), "--estimator",
                                      "lgbm-small", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert load_model(out) is not None
    simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=6, seed=1)).write(tmp_path / "ok")
    result = CliRunner().invoke(app, ["train", str(tmp_path / "ok"), "--out",
                                      str(tmp_path / "h.holmes")])
    assert _one_error_line(result).startswith(
        f"error: {tmp_path / 'ok'}, column 'abnormal': every op is labelled abnormal=False")
    assert not (tmp_path / "h.holmes").exists()


def test_train_opens_the_optuna_storage_before_any_work(tmp_path):
    # The logs named here do not exist: a storage opened only after reading them (or after
    # building the training data, as before) would fail on them, or minutes later.
    missing = str(tmp_path / "missing.parquet")
    out = tmp_path / "m.holmes"
    for url in ("notaurl", f"sqlite:///{tmp_path}/no/such/dir/study.db"):
        line = _one_error_line(CliRunner().invoke(app, [
            "train", missing, "--estimator", "tuned-rf", "--storage", url, "--out", str(out)]))
        assert line.startswith(f"error: --storage {url!r}: cannot open it as an optuna "
                               "storage"), line
        assert "expected a database URL" in line and "sqlite:///" in line
    assert not out.exists()


@pytest.mark.parametrize(("option", "value"), [("--storage", "x"), ("--study", "x"),
                                               ("--trials", "30")])
def test_train_refuses_tuning_options_with_an_untuned_estimator(tmp_path, option, value):
    line = _one_error_line(CliRunner().invoke(app, [
        "train", "--preset", "tiny", option, value, "--out", str(tmp_path / "m.holmes")]))
    assert line == (f"error: {option} is only used by --estimator tuned-lgbm or tuned-rf (got "
                    "--estimator lgbm); drop it or pick a tuned estimator")
    assert not (tmp_path / "m.holmes").exists()


@pytest.mark.parametrize(("args", "said"), [
    (["some-logs/", "--preset", "quick"],
     "--preset quick: trains on simulated scenarios, not on the PATHs given; drop one of them"),
    (["--preset", "tiny", "--format", "kineto"],
     "--format kineto: says how to read PATHs, and none is given"),
    (["--preset", "tiny", "--estimator", "tuned-lgbm", "--study", "mine"],
     "--study mine: names a study in --storage; without one the study lives in memory"),
])
def test_train_refuses_options_it_would_ignore(tmp_path, args, said):
    line = _one_error_line(CliRunner().invoke(app, [
        "train", *args, "--out", str(tmp_path / "m.holmes")]))
    assert line.startswith(f"error: {said}"), line
    assert not (tmp_path / "m.holmes").exists()


def _labelled(seed: int = 11, iterations: int = 10):
    cfg = SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=iterations, seed=seed,
                    faults=(FaultSpec.parse("gpu_slow:rank=3,severity=0.8,start=4"),))
    return simulate(cfg).ops


@pytest.mark.parametrize(("bad", "said"), [
    ("maybe", "1 of {n} labels are not a boolean{at} (got 'maybe'; expected true/false/1/0 "
              "(case-insensitive))"),
    (2, "1 of {n} labels are not a boolean{at} (got 2; expected true/false/1/0 "
        "(case-insensitive))"),
    (None, "1 of {n} labels are missing{at} (expected true/false/1/0 (case-insensitive) in "
           "every row)"),
], ids=["text", "number", "gap"])
def test_train_refuses_a_label_that_is_not_a_boolean_naming_file_and_value(tmp_path, bad, said):
    ops = _labelled()
    good = tmp_path / "good.csv"
    ops.to_csv(good, index=False)
    labels = ops["abnormal"].astype(int).astype(object)  # 0/1, as some exporters write them
    labels.iloc[7] = bad
    other = _labelled(seed=12).assign(abnormal=labels)  # another run: no duplicate rows
    path = tmp_path / "bad.csv"
    other.to_csv(path, index=False)
    out = tmp_path / "m.holmes"
    for args, n in (([path], len(ops)), ([good, path], len(ops))):  # the file's own
        result = CliRunner().invoke(app, ["train", *map(str, args), "--estimator", "lgbm-small",
                                          "--out", str(out)])
        line = _one_error_line(result)
        op = other.iloc[7]  # the operator, as a row number may not survive the reader
        at = (f", the first of rank {op['rank']}, iteration {op['iteration']}, {op['op']} seq "
              f"{op['seq']} in {op['group']!r}")
        assert line == f"error: {path}, column 'abnormal': " + said.format(n=f"{n:,}", at=at), \
            line
    assert not out.exists()
    other.assign(abnormal=ops["abnormal"].astype(int)).to_csv(path, index=False)  # 0/1 is fine
    result = CliRunner().invoke(app, ["train", str(path), "--estimator", "lgbm-small", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output


def test_a_bad_label_deep_in_a_large_csv_is_refused_without_a_pandas_warning(tmp_path):
    import subprocess
    import sys

    import pandas as pd

    # Beyond pandas' first parsing chunk (2**18 rows) the text labels were read as strings
    # after booleans: a DtypeWarning on the terminal, and every 'false' taken as true.
    ops = _labelled(iterations=14)
    copies = 2**18 // len(ops) + 1
    big = pd.concat([ops.assign(iteration=ops["iteration"] + 14 * k) for k in range(copies)],
                    ignore_index=True)
    big["abnormal"] = big["abnormal"].map({True: "true", False: "false"}).astype(object)
    big.loc[big.index[-1], "abnormal"] = "maybe"
    path = tmp_path / "big.csv"
    big.to_csv(path, index=False)
    proc = subprocess.run([sys.executable, "-c", "from holmes_ml.cli import main; main()",
                           "train", str(path), "--estimator", "lgbm-small", "--out",
                           str(tmp_path / "m.holmes")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    op = big.iloc[-1]
    assert proc.stderr.strip() == (f"error: {path}, column 'abnormal': 1 of {len(big):,} labels "
                                   f"are not a boolean, the first of rank {op['rank']}, "
                                   f"iteration {op['iteration']}, {op['op']} seq {op['seq']} in "
                                   f"{op['group']!r} (got 'maybe'; expected true/false/1/0 "
                                   "(case-insensitive))")


def test_train_warns_when_few_operators_are_labelled_abnormal(tmp_path, caplog):
    cfg = SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=12,
                    faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.8,start=4"),))
    ops = simulate(cfg).ops
    assert ops["abnormal"].sum() >= 50
    for name, keep in [("many", int(ops["abnormal"].sum())), ("few", 6)]:
        labelled = ops.copy()
        labelled.loc[labelled.index[labelled["abnormal"]][keep:], "abnormal"] = False
        labelled.to_parquet(tmp_path / f"{name}.parquet")
        caplog.clear()
        with caplog.at_level("WARNING"):
            result = CliRunner().invoke(app, ["train", str(tmp_path / f"{name}.parquet"),
                                              "--estimator", "lgbm-small", "--out",
                                              str(tmp_path / f"{name}.holmes")])
        assert result.exit_code == 0, result.output
        warned = f"only 6 abnormal operator(s) among {len(ops)} to learn from" in caplog.text
        assert warned == (name == "few"), caplog.text


def test_each_path_is_a_run_whose_features_are_built_on_their_own(tmp_path, caplog):
    """Two runs of one layout read as one table were each other's peers and history (and
    warned of rows they share); a PATH whose ranks were seen starts another run, per-rank
    files of one job are one, and the last fifth of each run is held out."""
    from holmes_ml.features import build_features
    from holmes_ml.models.persist import data_hash

    runs = []
    for seed, rank in ((21, 3), (22, 9)):
        res = simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=seed, faults=(
            FaultSpec.parse(f"gpu_slow:rank={rank},severity=0.8,start=3"),)))
        res.write(tmp_path / f"run{seed}")
        runs.append(res.ops)
    # the first run as one file per rank, as a logger writes it: one run all the same
    (tmp_path / "ranks").mkdir()
    files = []
    for r, part in runs[0].groupby("rank"):
        files.append(tmp_path / "ranks" / f"rank{r:02d}.parquet")
        part.to_parquet(files[-1], index=False)
    out = tmp_path / "m.holmes"
    with caplog.at_level("WARNING"):
        result = CliRunner().invoke(app, ["train", *map(str, files),
                                          str(tmp_path / "run22"), "--estimator", "lgbm-small",
                                          "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "share rank, group, seq" not in caplog.text
    metrics = read_header(out)["metrics"]
    assert metrics["runs"] == 2 and metrics["train_rows"] == sum(map(len, runs))
    assert metrics["late_rows"] == sum(int((r["iteration"] >= 8).sum()) for r in runs)
    assert metrics["train_abnormal"] == sum(int(r["abnormal"].sum()) for r in runs)
    assert {"late_f1", "late_precision", "late_recall"} <= set(metrics)
    assert "late_f1: " in result.output and "late_recall: " in result.output
    from holmes_ml import pipeline

    first = pipeline.read_paths(files)  # the rank files read together, as the CLI reads them
    assert len(first) == len(runs[0])
    X = pd.concat([build_features(first), build_features(runs[1])], ignore_index=True)
    y = np.concatenate([first["abnormal"].to_numpy(bool), runs[1]["abnormal"].to_numpy(bool)])
    assert read_header(out)["training_data_sha256"] == data_hash(X, y)


def test_two_runs_in_one_directory_are_refused_not_trained_as_one(tmp_path):
    """Read as one table, two runs of one layout would be each other's peers and history."""
    both = tmp_path / "both"
    both.mkdir()
    for seed in (31, 32):
        simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=6, seed=seed, faults=(
            FaultSpec.parse("gpu_slow:rank=3,severity=0.8,start=2"),))).ops.to_parquet(
                both / f"run{seed}.parquet", index=False)
    out = tmp_path / "m.holmes"
    r = CliRunner().invoke(app, ["train", str(both), "--estimator", "lgbm-small", "--out",
                                 str(out)])
    assert r.exit_code == 2 and not out.exists()
    said = " ".join(r.stderr.split())
    assert str(both) in said and "two runs" in said and "one run per PATH" in said
    # each file as its own PATH: two runs, trained
    r = CliRunner().invoke(app, ["train", *(str(p) for p in sorted(both.iterdir())),
                                 "--estimator", "lgbm-small", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert read_header(out)["metrics"]["runs"] == 2


def test_train_tunes_once_in_a_shared_study_of_one_estimator(tmp_path, capfd):
    """--trials N runs N trials (the fit on every row reuses the held-out fit's study), in a
    study named after the estimator by default; a study of another estimator, an in-memory
    database and an --out that is the database are refused before any work."""
    import optuna

    cfg = SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=23,
                    faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.8,start=3"),))
    simulate(cfg).write(tmp_path / "run")
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    args = ["train", str(tmp_path / "run"), "--trials", "2", "--storage", url]
    result = CliRunner().invoke(app, [*args, "--estimator", "tuned-lgbm", "--out",
                                      str(tmp_path / "t.holmes")])
    assert result.exit_code == 0, result.output
    assert optuna.get_all_study_names(url) == ["holmes-tuned-lgbm"]
    # the storage check's scratch study is not announced as if it were the one tuned
    said = capfd.readouterr().err + result.output
    assert "holmes-write-check" not in said and "holmes-tuned-lgbm" in said, said
    assert len(optuna.load_study(study_name="holmes-tuned-lgbm", storage=url).trials) == 2
    # the envelope says how the model was made, readable without loading it
    made = read_header(tmp_path / "t.holmes")["extra"]
    assert (made["estimator_option"], made["seed"], made["trials"], made["study"]) == (
        "tuned-lgbm", 0, 2, "holmes-tuned-lgbm")
    assert made["storage"] == url and made["sources"] == [str((tmp_path / "run").resolve())]
    tuned = load_model(tmp_path / "t.holmes")
    assert made["fitted"] == {"threshold": tuned.threshold_, "best_params": tuned.best_params_,
                              "best_score": tuned.best_score_, "n_trials": 2,
                              "study_name": "holmes-tuned-lgbm"}
    # without a storage (an in-memory study) the saved model keeps what the trials chose
    result = CliRunner().invoke(app, [*args[:4], "--estimator", "tuned-rf", "--out",
                                      str(tmp_path / "mem.holmes")])
    assert result.exit_code == 0, result.output
    tuned = load_model(tmp_path / "mem.holmes")
    assert tuned.n_trials_ == 2 and tuned.best_params_
    assert tuned.best_estimator_.get_params()["max_depth"] == tuned.best_params_["max_depth"]
    result = CliRunner().invoke(app, [*args, "--estimator", "tuned-rf", "--study",
                                      "holmes-tuned-lgbm", "--out", str(tmp_path / "r.holmes")])
    assert _one_error_line(result).startswith(
        "error: TunedDetector: study 'holmes-tuned-lgbm' in ")
    assert "tunes 'lgbm', not 'rf'" in _one_error_line(result)
    result = CliRunner().invoke(app, [*args, "--estimator", "tuned-rf", "--out", str(db)])
    assert _one_error_line(result).startswith(f"error: --out {db}: is the --storage database")
    result = CliRunner().invoke(app, ["train", str(tmp_path / "run"), "--estimator", "tuned-rf",
                                      "--storage", "sqlite:///", "--out",
                                      str(tmp_path / "m.holmes")])
    assert _one_error_line(result).startswith("error: --storage 'sqlite:///': an in-memory")
    assert len(optuna.load_study(study_name="holmes-tuned-lgbm", storage=url).trials) == 2


def test_a_bad_label_in_a_directory_names_its_file(tmp_path):
    ops = _labelled(seed=13)
    logs = tmp_path / "logs"
    logs.mkdir()
    for r, part in ops.groupby("rank"):
        part = part.assign(abnormal=part["abnormal"].astype(object))
        if r == 6:
            part.iloc[2, part.columns.get_loc("abnormal")] = "maybe"
        part.to_csv(logs / f"rank{r:02d}.csv", index=False)
    (logs / "notes.txt").write_text("not a log")
    result = CliRunner().invoke(app, ["train", str(logs), "--estimator", "lgbm-small",
                                      "--out", str(tmp_path / "m.holmes")])
    assert _one_error_line(result).startswith(
        f"error: {logs / 'rank06.csv'}, column 'abnormal': 1 of "), result.output


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare for a read-only bind mount")
def test_a_read_only_study_database_is_refused_before_any_work_with_the_drivers_reason(
        tmp_path):
    import subprocess
    import sys

    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "study.db").touch()
    url = f"sqlite:///{ro / 'study.db'}"
    script = ("from holmes_ml.cli import main; main()")
    cmd = (f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && "
           f"{sys.executable} -c '{script}' train {tmp_path / 'missing'} --estimator tuned-rf "
           f"--storage {url} --out {tmp_path / 'm.holmes'}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True,
                       timeout=120)
    if "mount" in r.stderr and "error:" not in r.stderr:
        pytest.skip(f"no read-only bind mount here: {r.stderr.strip()[:200]}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith(f"error: --storage {url!r}: cannot open it as an optuna "
                                       "storage and write to it (attempt to write a readonly "
                                       "database)"), r.stderr


def test_trainings_started_together_on_a_fresh_study_database_both_open_it(tmp_path):
    """Processes opening a new sqlite study at once race to create optuna's tables (UNIQUE
    constraint failed: alembic_version.version_num, table ... already exists); the storage
    check tries again after a short random pause instead of failing the loser."""
    import threading

    from holmes_ml.cli.train import _check_storage

    errors: list[str] = []

    def check(url: str) -> None:
        try:
            _check_storage(url, tmp_path / "m.holmes")
        except ValueError as exc:
            errors.append(str(exc))

    for k in range(4):  # each race is lost by chance: several fresh files
        url = f"sqlite:///{tmp_path / f'fresh{k}.db'}"
        threads = [threading.Thread(target=check, args=(url,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_runs_are_grouped_by_directory_and_job_whatever_the_order_of_the_paths(tmp_path):
    """`holmes train jobs/*/lo.parquet jobs/*/hi.parquet` used to read B/lo with A/hi as one
    run (a PATH joined the run before it when their ranks differed); PATHs are now grouped by
    directory and job, the same in any order, and the grouping is printed."""
    from holmes_ml.features import build_features
    from holmes_ml.models.persist import data_hash

    whole = {}
    for job, seed, rank in (("A", 31, 3), ("B", 32, 12)):
        ops = simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=seed, faults=(
            FaultSpec.parse(f"gpu_slow:rank={rank},severity=0.8,start=3"),))).ops
        (tmp_path / "jobs" / job).mkdir(parents=True)
        ops[ops["rank"] < 8].to_parquet(tmp_path / "jobs" / job / "lo.parquet", index=False)
        ops[ops["rank"] >= 8].to_parquet(tmp_path / "jobs" / job / "hi.parquet", index=False)
        whole[job] = pd.concat([ops[ops["rank"] >= 8], ops[ops["rank"] < 8]],
                               ignore_index=True)  # as read: hi, then lo
    X = pd.concat([build_features(whole["A"]), build_features(whole["B"])], ignore_index=True)
    y = np.concatenate([whole[j]["abnormal"].to_numpy(bool) for j in "AB"])

    def train(*names: str) -> dict:
        out = tmp_path / f"m{len(list(tmp_path.glob('m*.holmes')))}.holmes"
        result = CliRunner().invoke(app, ["train", *(str(tmp_path / "jobs" / n) for n in names),
                                          "--estimator", "lgbm-small", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert "  runs: 2\n" in result.output, result.output
        assert f"run 1 (16 ranks, job sim): {tmp_path}/jobs/A/hi.parquet, {tmp_path}/jobs/A/lo.parquet" \
            in result.output, result.output
        return read_header(out)

    globbed = train("A/lo.parquet", "B/lo.parquet", "A/hi.parquet", "B/hi.parquet")
    assert globbed["metrics"]["runs"] == 2
    assert globbed["training_data_sha256"] == data_hash(X, y)
    assert train("B/hi.parquet", "A/lo.parquet", "B/lo.parquet", "A/hi.parquet")[
        "training_data_sha256"] == data_hash(X, y)
    # two jobs' files in one directory, ranks apart: the job column keeps them apart
    mixed = tmp_path / "jobs" / "mixed"
    mixed.mkdir()
    for job, half in (("A", "lo"), ("B", "hi")):
        part = pd.read_parquet(tmp_path / "jobs" / job / f"{half}.parquet")
        part.assign(job=f"job-{job}").to_parquet(mixed / f"{job}.parquet", index=False)
    from holmes_ml.cli.train import _read_labelled, _runs

    paths = [mixed / "A.parquet", mixed / "B.parquet"]
    assert _runs(paths, [_read_labelled(p, "auto") for p in paths]) == [[0], [1]]


def test_a_warning_of_the_fit_is_said_once_not_per_fit(tmp_path, caplog):
    """`holmes train PATH` fits twice (on the early iterations for late_f1, then on all): the
    screened detector's warning of a screen cut on few runs came out twice."""
    res = simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=23, faults=(
        FaultSpec.parse("gpu_slow:rank=6,severity=0.8,start=3"),)))
    res.ops.to_parquet(tmp_path / "one.parquet")
    with caplog.at_level("WARNING"):
        result = CliRunner().invoke(app, ["train", str(tmp_path / "one.parquet"), "--estimator",
                                          "lgbm", "--out", str(tmp_path / "m.holmes")])
    assert result.exit_code == 0, result.output
    assert read_header(tmp_path / "m.holmes")["metrics"]["late_f1"] >= 0
    assert caplog.text.count("screen: cut on 1 runs") == 1, caplog.text


def test_per_rank_files_of_two_runs_are_two_runs_whatever_their_names(tmp_path):
    """rank{r}_day1.csv and rank{r}_day2.csv of two runs of the same ranks, a day apart, sort
    rank by rank: a file joined the run before it when their ranks differed, so the runs were
    (0), (0 1), (1 2) ... of both days, whose collectives' copies lay a day apart. A file now
    joins the first run lacking its ranks whose time span its own overlaps."""
    from holmes_ml.cli.train import _read_labelled, _runs

    day = 86_400 * 10**9
    logs = tmp_path / "perrank"
    logs.mkdir()
    for d, seed in ((1, 41), (2, 42)):
        ops = _labelled(seed=seed)
        ops = ops.assign(start_ns=ops["start_ns"] + (d - 1) * day)
        for r, part in ops.groupby("rank"):
            part.to_csv(logs / f"rank{r:02d}_day{d}.csv", index=False)
    paths = sorted(logs.iterdir())
    runs = _runs(paths, [_read_labelled(p, "auto") for p in paths])
    assert sorted(sorted(paths[k].name[-8:] for k in run) for run in runs) == [
        ["day1.csv"] * 16, ["day2.csv"] * 16]


def test_a_path_given_twice_is_read_once_and_an_all_abnormal_run_is_named(tmp_path, caplog):
    """`holmes train good1 good1 good2` trained good1 twice, as two runs (double weight, and
    on both sides of the folds that pick the threshold); a run labelled abnormal throughout
    beside healthy-and-faulty ones went unremarked."""
    for name, seed in (("good1", 51), ("good2", 52)):
        simulate(SimConfig(gpus=16, tp=2, pp=2, dp=4, iterations=10, seed=seed, faults=(
            FaultSpec.parse("gpu_slow:rank=3,severity=0.8,start=3"),))).write(tmp_path / name)
    (tmp_path / "allpos").mkdir()
    pd.read_parquet(tmp_path / "good2" / "ops.parquet").assign(abnormal=True).to_parquet(
        tmp_path / "allpos" / "ops.parquet", index=False)
    out = tmp_path / "m.holmes"
    g1, g2, allpos = (str(tmp_path / n) for n in ("good1", "good2", "allpos"))
    with caplog.at_level("WARNING"):
        result = CliRunner().invoke(app, ["train", g1, g1 + "/ops.parquet", g2, allpos,
                                          "--estimator", "lgbm-small", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"{g1}/ops.parquet: its logs are already read from {g1}; read once" in caplog.text
    assert f"{allpos}: every one of its " in caplog.text
    assert f"{g2}: every one" not in caplog.text
    assert read_header(out)["metrics"]["runs"] == 3
    # a PATH holding part of another's files is refused
    result = CliRunner().invoke(app, ["train", g1 + "/ops.parquet", str(tmp_path), "--estimator",
                                      "lgbm-small", "--out", str(tmp_path / "n.holmes")])
    line = _one_error_line(result)
    assert line.startswith(f"error: {tmp_path}: 1 of its ") and line.endswith(
        f" files are also read from {g1}/ops.parquet (expected each run's files in one PATH, "
        "given once)"), line
