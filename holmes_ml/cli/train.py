"""``holmes train``: train a detector on simulator scenarios or labelled logs, save an envelope."""

from __future__ import annotations

import logging
import random
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import typer

from holmes_ml.cli._checks import (
    bad_labels,
    check_not_input,
    check_seed,
    check_writable,
    format_help,
    format_option,
    op_named,
)
from holmes_ml.io.schema import SchemaError

logger = logging.getLogger(__name__)


def register(app: typer.Typer) -> None:
    """Add ``holmes train`` to ``app``."""

    @app.command("train")
    def train(
        paths: list[Path] = typer.Argument(
            None,
            help="Labelled CommOps logs (any format `holmes localize` reads, simulator output "
            "directories included) with an `abnormal` column of true/false or 1/0 "
            "(case-insensitive; anything else is refused). PATHs in one directory (a "
            "directory PATH: its own) naming one job (the logs' job column, if any) are one "
            "run, read together in the order of their names, unless a PATH has ranks another "
            "of them has: it starts another run. The grouping does not depend on the order "
            "PATHs are given in, and is printed. Each run's features are built on their own; "
            "late_f1 / late_precision / late_recall are measured on the last fifth of each "
            "run's iterations by a fit on the rest (the same runs and faults: held-out jobs "
            "say more about other jobs). Without PATHs the detector is trained on the --preset "
            "simulator scenarios (heldout_f1 / _precision / _recall: on runs of other seeds).",
            show_default=False,
        ),
        out: Path = typer.Option(Path("model.holmes"), "--out", help="Model envelope to write."),
        format: str = typer.Option(
            "auto", "--format", help=format_help("Format of the PATHs"), callback=format_option
        ),
        preset: str | None = typer.Option(
            None, "--preset", show_default=False,
            help="Simulator scenario mix, when no PATH is given: default (the bundled model's: "
            "240 runs of 64-1,024 GPUs, every fault kind in every pattern at every scale in "
            "each of three mixes: at 1-6 % compute jitter, at up to 10 % with transfer drift, "
            "and at 1-6 % with mild faults, severity 0.08-0.35), plain (its first third alone), "
            "quick (8 runs of 64-128 GPUs: to try the command) or tiny (3 runs of "
            "64 GPUs, seconds: for tests).  [default: default]"
        ),
        estimator: str = typer.Option(
            "lgbm", "--estimator",
            help="lgbm (the bundled model's configuration: 100 trees on the scale-free "
            "columns behind a 30-tree screen that scores the rows it cannot rule out), "
            "lgbm-unscreened (the same trees scoring every row, ~3x slower), lgbm-absolute "
            "(every column, absolute microseconds included), lgbm-small (30 depth-3 trees "
            "alone), rf, or tuned-lgbm / tuned-rf (optuna)."
        ),
        seed: int = typer.Option(
            0, "--seed", help="Seeds scenarios and estimators, and the tuner's sampler "
            "without --storage (with one, each process draws its own, so that processes "
            "sharing a study try different configurations: not reproducible from --seed)."),
        n_trials: int | None = typer.Option(None, "--trials", min=1, show_default=False,
                                            help="Optuna trials (tuned-* only)  [default: 10]"),
        storage: str = typer.Option(
            None, "--storage", help="Optuna RDB URL shared by several processes, "
            "e.g. sqlite:///study.db (tuned-* only; opened before training starts, tried again "
            "a few times when processes started together race to create a new database's "
            "tables)."
        ),
        study: str = typer.Option(
            None, "--study", show_default=False,
            help="Optuna study name (tuned-* only; one study tunes one estimator).  "
            "[default with --storage: holmes-ESTIMATOR]"),
    ) -> None:
        """Train a detector and save it as a checked model envelope with its metrics.

        Examples:

          holmes train --preset default --out mine.holmes   (as the bundled model was trained)

          holmes train labelled/ --estimator tuned-rf --trials 30 --storage sqlite:///study.db --study s1

          holmes train run1/ run2/ run3/ --out mine.holmes   (three labelled runs)

        Several processes given the same --storage and --study tune one optuna study together
        (each draws its own sampler seed, so they try different configurations).
        """
        from holmes_ml.models import RandomForestDetector, TunedDetector
        from holmes_ml.models.training import (
            PRESETS,
            absolute_estimator,
            default_estimator,
            small_estimator,
            train_default,
        )

        check_seed(seed)
        check_writable(out, "--out")
        check_not_input(out, "--out", paths or [])
        # Refused rather than ignored: each names what the other kind of training data uses.
        if paths and preset is not None:
            raise ValueError(f"--preset {preset}: trains on simulated scenarios, not on the "
                             "PATHs given; drop one of them")
        if not paths and format != "auto":
            raise ValueError(f"--format {format}: says how to read PATHs, and none is given "
                             "(training on --preset scenarios); drop it or give the logs")
        preset = preset or "default"
        if preset not in PRESETS:
            raise typer.BadParameter(f"got {preset!r}; expected one of {sorted(PRESETS)}",
                                     param_hint="--preset")
        if estimator == "lgbm":
            det = default_estimator(seed)
        elif estimator == "lgbm-unscreened":
            det = default_estimator(seed, screened=False)
        elif estimator == "lgbm-absolute":
            det = absolute_estimator(seed)
        elif estimator == "lgbm-small":
            det = small_estimator(seed)
        elif estimator == "rf":
            det = RandomForestDetector(n_estimators=60, max_depth=14, min_samples_leaf=5,
                                       threshold="auto", random_state=seed)
        elif estimator in ("tuned-lgbm", "tuned-rf"):
            if storage is not None:
                _check_storage(storage, out)
                # unnamed, each process would make a study of its own in the database
                study = study or f"holmes-{estimator}"
            det = TunedDetector(estimator.split("-")[1], n_trials=n_trials or 10, storage=storage,
                                study_name=study, random_state=seed,
                                progress=sys.stderr.isatty())
        else:
            raise typer.BadParameter(
                f"got {estimator!r}; expected lgbm, lgbm-unscreened, lgbm-absolute, lgbm-small, rf, "
                "tuned-lgbm or tuned-rf",
                param_hint="--estimator",
            )
        given = [name for name, value in (("--trials", n_trials), ("--storage", storage),
                                           ("--study", study)) if value is not None]
        if not estimator.startswith("tuned-") and given:
            # Refused rather than ignored: the user expects trials (in a shared study).
            option = given[0]
            raise ValueError(f"{option} is only used by --estimator tuned-lgbm or tuned-rf "
                             f"(got --estimator {estimator}); drop it or pick a tuned estimator")
        if study is not None and storage is None:
            raise ValueError(f"--study {study}: names a study in --storage; without one the "
                             "study lives in memory and its name would be ignored (expected "
                             "--storage sqlite:///study.db beside it, or no --study)")
        described: list[str] = []
        # how the model was made, in its envelope (holmes_ml.models.read_header(...)["extra"])
        made = {"estimator_option": estimator, "seed": seed}
        if estimator.startswith("tuned-"):
            from holmes_ml.models.tuner import storage_label

            made.update(trials=det.n_trials, study=study,
                        storage=storage_label(storage) if storage is not None else None)
        if paths:
            metrics, described = _train_on_logs(paths, det, out, format, made)
        else:
            metrics = train_default(out, preset=preset, seed=seed, estimator=det,
                                    progress=sys.stderr.isatty(), extra=made)
        size = out.stat().st_size
        typer.echo(f"wrote {out} ({size / 1e6:.2f} MB)")
        if storage is not None:  # where the trials are, for the next process to join
            from holmes_ml.models.tuner import storage_label

            typer.echo(f"  study: {study} in {storage_label(storage)}")
        for k, v in metrics.items():
            rate = k.endswith(("_f1", "_precision", "_recall"))
            typer.echo(f"  {k}: {v:,.0f}" if float(v).is_integer() and not rate
                       else f"  {k}: {v:.4g}")
        if described:  # which PATHs were read together (features are built per run)
            typer.echo("\n".join(described))


def _check_storage(url: str, out: Path) -> None:
    """Open the optuna storage now and write to it: a typo, a missing directory or driver, a
    read-only or unreachable database fails here instead of after the training data was
    built; so does an in-memory database (nothing shared) or one that ``out`` would replace."""
    import optuna
    from sqlalchemy.engine import make_url

    from holmes_ml.models.tuner import storage_label

    shown = storage_label(url) if "://" in url else url

    try:
        db = make_url(url)
    except Exception as exc:  # noqa: BLE001 - sqlalchemy raises several kinds
        raise ValueError(f"--storage {shown!r}: cannot open it as an optuna storage (not a "
                         f"database URL: {exc}); expected a database URL that opens, e.g. "
                         "sqlite:///study.db"
                         ) from exc
    if db.get_backend_name() == "sqlite":
        if db.database in (None, "", ":memory:"):
            raise ValueError(f"--storage {shown!r}: an in-memory database, shared with no "
                             "process and gone at exit; expected a file, e.g. "
                             "sqlite:///study.db")
        if Path(db.database).resolve() == out.resolve():
            raise ValueError(f"--out {out}: is the --storage database; writing the model "
                             "there would destroy the study. Expected another file")
    # optuna logs "A new study created in RDB with name: ..." for this scratch study: quiet
    # here, the user would take it for the study being tuned
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        for attempt in range(_STORAGE_ATTEMPTS):
            try:
                _write_check(url)
                break
            except Exception as exc:  # noqa: BLE001 - sqlalchemy and the drivers raise many
                # Processes started together on a fresh database race to create optuna's
                # schema (UNIQUE constraint failed: alembic_version.version_num, table ...
                # already exists, database is locked): the loser finds the schema made when it tries again. Other
                # errors (a missing driver, a read-only file, an unreachable host) are final.
                if attempt + 1 == _STORAGE_ATTEMPTS or not _a_race(exc):
                    raise
                time.sleep(random.uniform(0.05, 0.25) * (attempt + 1))
    except Exception as exc:  # noqa: BLE001 - sqlalchemy and the drivers raise many kinds
        root: BaseException = exc  # the driver's reason, under optuna's and sqlalchemy's
        for _ in range(20):  # (a chain is short; a cycle in one must not hang)
            below = root.__cause__ or root.__context__
            if below is None:
                break
            root = below
        why = str(root).strip().splitlines()[0] if str(root).strip() else type(root).__name__
        tries = f"; {_STORAGE_ATTEMPTS} attempts" if _a_race(exc) else ""
        raise ValueError(f"--storage {shown!r}: cannot open it as an optuna storage and write "
                         f"to it ({why}{tries}); expected a database URL that opens and takes "
                         "writes, e.g. sqlite:///study.db") from exc
    finally:
        optuna.logging.set_verbosity(verbosity)


#: Tries of the storage check before a race's error is final.
_STORAGE_ATTEMPTS = 5


def _write_check(url: str) -> None:
    """Open the storage, create and delete a scratch study in it."""
    import optuna

    storage = optuna.storages.RDBStorage(url)
    try:
        name = f"holmes-write-check-{uuid.uuid4().hex}"
        optuna.delete_study(study_name=optuna.create_study(storage=storage,
                                                           study_name=name).study_name,
                            storage=storage)
    finally:
        storage.engine.dispose()


def _a_race(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is what processes opening one database together meet:
    a unique constraint of a row both inserted, a table the other created first, or sqlite's
    lock."""
    from sqlalchemy.exc import DBAPIError, IntegrityError

    seen: BaseException | None = exc
    for _ in range(20):  # (a chain is short; a cycle in one must not hang)
        if seen is None:
            return False
        if isinstance(seen, IntegrityError) or (isinstance(seen, DBAPIError) and any(
                why in str(seen) for why in ("already exists", "database is locked"))):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _labels(ops, files: list[Path], format: str) -> np.ndarray:  # noqa: ANN001
    """The ``abnormal`` column as booleans; a value that is not one (``maybe``, ``2``, a gap)
    is refused naming the file that holds it, rather than read as ``True``."""
    y, bad = bad_labels(ops["abnormal"])
    if not bad.any():
        return y
    source = ", ".join(map(str, files))
    first = ops.iloc[int(np.flatnonzero(bad)[0])]
    if len(files) == 1 and files[0].is_dir():  # which file of the directory
        from holmes_ml.io.readers import _members

        files = _members(files[0])[0]
        if len(files) == 1:
            source = str(files[0])
    if len(files) > 1:  # which of them: read them one by one (only on this error path)
        from holmes_ml import pipeline

        for f in files:
            try:
                own = pipeline.read_paths([f], format)
            except (SchemaError, ValueError, OSError):
                continue  # no log (the directory's read skipped it with a warning)
            if "abnormal" not in own.columns:
                raise SchemaError("missing while other files have it", source=str(f),
                                  column="abnormal", expected="labels in every file")
            own_bad = bad_labels(own["abnormal"])[1]
            if own_bad.any():
                source = str(f)
                first = own.iloc[int(np.flatnonzero(own_bad)[0])]
                break
    # the operator, not a row number: the reader may have reordered or dropped rows
    how_many = (f"{int(bad.sum()):,} of {len(bad):,} labels", f", the first of {op_named(first)}")
    if pd.isna(first["abnormal"]):
        raise SchemaError(f"{how_many[0]} are missing{how_many[1]}", source=source,
                          column="abnormal",
                          expected="true/false/1/0 (case-insensitive) in every row")
    raise SchemaError(f"{how_many[0]} are not a boolean{how_many[1]}", source=source,
                      column="abnormal", value=first["abnormal"],
                      expected="true/false/1/0 (case-insensitive)")


#: Fewer abnormal operators than this are too few to learn a detector from (a warning).
_FEW_ABNORMAL = 50


def _read_labelled(path: Path, format: str) -> tuple[pd.DataFrame, np.ndarray]:
    """One PATH's operators and their labels."""
    from holmes_ml import pipeline

    files, _ = pipeline.resolve_paths([path])
    ops = pipeline.read_paths(files, format, progress=sys.stderr.isatty())
    reused = int(ops.attrs.get("reused_key_rows", 0))
    if reused:
        # two runs in one directory: built as one table, each would be the other's peers
        # and history, and the model would learn from features no single job has
        raise SchemaError(f"{reused:,} rows share an operator's identity (iteration, rank, "
                          "group, seq, op) with others: two runs, or a restarted job, read "
                          "as one", source=str(path),
                          expected="one run per PATH: give each run's files or directory as "
                          "a PATH of its own (the warning above names the files)")
    if "abnormal" not in ops.columns:
        raise SchemaError("missing; training needs op-level labels", source=str(path),
                          column="abnormal",
                          expected="true where a fault prolonged the op beyond its normal "
                          "spread, e.g. from `holmes simulate`")
    return ops, _labels(ops, files, format)


def _distinct(paths: list[Path]) -> list[Path]:
    """``paths`` with each log file read once: a PATH whose files an earlier PATH already
    holds (the same PATH twice, a file and its directory) is left out with a warning, since
    trained as a run of its own it would weigh double and sit on both sides of the folds that
    pick the threshold and tune; a PATH holding some of another's files is refused."""
    from holmes_ml import pipeline
    from holmes_ml.io.readers import _members

    seen: dict[Path, Path] = {}
    kept = []
    for path in paths:
        files = {g.resolve() for f in pipeline.resolve_paths([path])[0]
                 for g in (_members(f)[0] if f.is_dir() else [f])}
        held = {f: seen[f] for f in files if f in seen}
        if not held:
            kept.append(path)
            seen.update(dict.fromkeys(files, path))
        elif len(held) == len(files):
            logger.warning("%s: its logs are already read from %s; read once", path,
                           next(iter(held.values())))
        else:
            raise SchemaError(f"{len(held)} of its {len(files)} files are also read from "
                              f"{next(iter(held.values()))}", source=str(path),
                              expected="each run's files in one PATH, given once")
    return kept


def _runs(paths: list[Path], parts: list[tuple[pd.DataFrame, np.ndarray]]
          ) -> list[list[int]]:
    """Which PATHs (by index) are one run, whatever order they were given in: PATHs of one
    directory (a PATH that is a directory: its own) naming the same job (the ``job`` column,
    when the logs have one) are one run. Taken in the order of their names, a PATH joins the
    first run of its directory that lacks its ranks and whose time span its own overlaps, and
    starts another run otherwise (two jobs of the same ranks in one directory: per-rank files
    of two runs, whichever order their names sort in). Runs come in the order of their
    directories' names."""
    from holmes_ml.io.schema import job_of

    groups: dict[tuple[str, str], list[int]] = {}
    for k, (path, (ops, _)) in enumerate(zip(paths, parts, strict=True)):
        where = path.resolve() if path.is_dir() else path.resolve().parent
        found = job_of(ops)
        groups.setdefault((str(where), found[1] if found else ""), []).append(k)
    runs: list[list[int]] = []
    for key in sorted(groups):
        # per run of this directory: its ranks and the span of its operators' starts
        mine: list[tuple[list[int], set[int], list[int]]] = []
        for k in sorted(groups[key], key=lambda k: (paths[k].name, str(paths[k]))):
            ops = parts[k][0]
            ranks = set(map(int, pd.unique(ops["rank"])))
            start = ops["start_ns"].to_numpy()
            lo, hi = (int(start.min()), int(start.max())) if len(start) else (0, 0)
            home = next((run for run in mine if not ranks & run[1]
                         and lo <= run[2][1] and run[2][0] <= hi), None)
            if home is None:
                mine.append(([k], ranks, [lo, hi]))
            else:
                home[0].append(k)
                home[1].update(ranks)
                home[2][:] = [min(home[2][0], lo), max(home[2][1], hi)]
        runs += [run[0] for run in mine]
    return runs


def _describe_runs(paths: list[Path], parts: list[tuple[pd.DataFrame, np.ndarray]],
                   runs: list[list[int]]) -> list[str]:
    """One line per run: its ranks, job and PATHs (printed with the metrics)."""
    from holmes_ml.io.schema import job_of

    lines = []
    for i, run in enumerate(runs, 1):
        ranks = {int(r) for k in run for r in pd.unique(parts[k][0]["rank"])}
        found = job_of(parts[run[0]][0])
        job = f", job {found[1]}" if found else ""
        names = [str(paths[k]) for k in run]
        shown = ", ".join(names) if len(names) <= 4 else \
            f"{names[0]}, {names[1]}, ... {names[-1]} ({len(names)} PATHs)"
        lines.append(f"  run {i} ({len(ranks)} ranks{job}): {shown}")
    return lines


def _train_on_logs(paths: list[Path], det, out: Path, format: str,  # noqa: ANN001
                   made: dict | None = None) -> tuple[dict[str, float], list[str]]:
    """Fit ``det`` on labelled logs. The PATHs of a run (see :func:`_runs`: one directory,
    one job, no rank twice) are read together; each run's features are built on their own
    (two jobs read as one table would be each other's peers and history). ``late_f1``,
    ``late_precision`` and ``late_recall`` are measured on the last fifth of each run's
    iterations (``late_rows``) by a fit on the rest: the same runs, faults and devices, so
    they say more about fitting than about other jobs (held-out jobs, or ``holmes bench
    detector``, measure that). Then ``det`` is fitted on every row (a tuned detector with the
    configuration that fit chose). Returns the metrics and a line per run."""
    from holmes_ml.features import build_features
    from holmes_ml.models import save_model
    from holmes_ml.models.training import takes_groups

    paths = _distinct(paths)
    parts = [_read_labelled(p, format) for p in paths]
    groups = _runs(paths, parts)
    described = _describe_runs(paths, parts, groups)
    if sys.stderr.isatty():  # before a long fit: which PATHs were read as one run
        print("\n".join(described), file=sys.stderr, flush=True)
    Xs, held_parts = [], []
    for run in groups:
        ops = pd.concat([parts[k][0] for k in run], ignore_index=True) if len(run) > 1 \
            else parts[run[0]][0]
        Xs.append(build_features(ops))
        iterations = ops["iteration"].to_numpy()
        held_parts.append(iterations > np.quantile(iterations, 0.8))
    if sys.stderr.isatty():
        print(f"features of {sum(map(len, Xs)):,} operators built; fitting ...",
              file=sys.stderr, flush=True)
    X = pd.concat(Xs, ignore_index=True)
    y = np.concatenate([parts[k][1] for run in groups for k in run])
    # the run of each row: folds (a tuner's trials, a threshold's pick) leave whole runs out
    run_of = np.repeat(np.arange(len(Xs)), [len(x) for x in Xs])
    runs = {"groups": run_of} if takes_groups(det) else None
    held = np.concatenate(held_parts)
    source = ", ".join(map(str, paths))
    if y.all() or not y.any():
        raise SchemaError(f"every op is labelled abnormal={bool(y[0])}", source=source,
                          column="abnormal",
                          expected="healthy and abnormal ops: a detector learns from both; "
                          "simulate jobs with a fault, or add healthy logs")
    for run in groups:
        own = np.concatenate([parts[k][1] for k in run])
        if len(groups) > 1 and own.all():
            logger.warning("%s: every one of its %d operators is labelled abnormal: its "
                           "healthy ones, labelled so too, teach the model to flag healthy "
                           "operators (label only what a fault prolonged)",
                           ", ".join(str(paths[k]) for k in run), len(own))
    if int(y.sum()) < _FEW_ABNORMAL:
        logger.warning("%s: only %d abnormal operator(s) among %d to learn from: the model "
                       "will catch little on other jobs (label more faulty runs, or add "
                       "simulated ones: holmes simulate --fault ...)", source, int(y.sum()),
                       len(y))
    metrics: dict[str, float] = {"runs": float(len(groups)), "train_rows": float(len(y)),
                                 "train_abnormal": float(y.sum()),
                                 "late_rows": float(held.sum())}
    # the late fit and the full one warn alike (a screen cut on few runs): say it once
    said = _SayOnce()
    screen_log = logging.getLogger("holmes_ml.models.screen")
    screen_log.addFilter(said)
    try:
        _fit_late_then_all(det, X, y, held, run_of, runs, metrics, source)
    finally:
        screen_log.removeFilter(said)
    save_model(det, out, metrics=metrics, training_data=(X, y),
               extra={**(made or {}), "format": format,
                      "sources": [str(p.resolve()) for p in paths],
                      "runs": [[str(paths[k].resolve()) for k in run] for run in groups]})
    return metrics, described


class _SayOnce(logging.Filter):
    """Lets a warning through once: the same message again is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


def _fit_late_then_all(det, X: pd.DataFrame, y: np.ndarray, held: np.ndarray,  # noqa: ANN001
                       run_of: np.ndarray, runs: dict | None, metrics: dict[str, float],
                       source: str) -> None:
    """Fit ``det`` on the early iterations and score the late ones into ``metrics``, then on
    every row (a tuned detector: its best configuration refitted)."""
    from sklearn.metrics import f1_score, precision_score, recall_score

    from holmes_ml.models import TunedDetector

    fitted = False
    if not y[held].any() or not y[~held].any():
        logger.warning("%s: the last fifth of the iterations holds %s abnormal operator(s) "
                       "and the rest %s: no late_f1 (it needs both to hold some; give "
                       "runs whose fault spans their end)", source, int(y[held].sum()),
                       int(y[~held].sum()))
    else:
        det.fit(X[~held], y[~held], **({"groups": run_of[~held]} if runs else {}))
        late = det.predict(X[held]).astype(bool)
        metrics.update(late_f1=float(f1_score(y[held], late)),
                       late_precision=float(precision_score(y[held], late, zero_division=0.0)),
                       late_recall=float(recall_score(y[held], late)))
        if isinstance(det, TunedDetector) and det.best_params_:
            # the study has its trials: the best of them on every row, without tuning again
            det.refit(X, y)
            fitted = True
    if not fitted:
        det.fit(X, y, **(runs or {}))
