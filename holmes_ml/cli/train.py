"""``holmes train``: train a detector on simulator scenarios or labelled logs, save an envelope."""

from __future__ import annotations

from pathlib import Path

import typer

from holmes_ml.cli._checks import check_seed, check_writable
from holmes_ml.io import FORMATS


def register(app: typer.Typer) -> None:
    """Add ``holmes train`` to ``app``."""

    @app.command("train")
    def train(
        paths: list[Path] = typer.Argument(
            None,
            help="Labelled CommOps logs (any format `holmes localize` reads, simulator output "
            "directories included) with a boolean `abnormal` column. Without PATHs the detector "
            "is trained on the --preset simulator scenarios.",
            show_default=False,
        ),
        out: Path = typer.Option(Path("model.holmes"), "--out", help="Model envelope to write."),
        format: str = typer.Option(
            "auto", "--format", help="Format of the PATHs: auto|" + "|".join(FORMATS) + "."
        ),
        preset: str = typer.Option(
            "default", "--preset",
            help="Simulator scenario mix: default (the bundled model's: 30 runs of 64-1,024 GPUs "
            "at 1-6 % compute jitter), wide (default plus 30 runs at up to 10 % jitter with "
            "transfer drift), quick (8 runs of 64-128 GPUs: to try the command) "
            "or tiny (3 runs of 64 GPUs, seconds: for tests)."
        ),
        estimator: str = typer.Option(
            "lgbm", "--estimator",
            help="lgbm (the bundled model's configuration: 100 trees on the scale-free "
            "columns behind a 30-tree screen that scores the rows it cannot rule out), "
            "lgbm-unscreened (the same trees scoring every row, ~3x slower), lgbm-absolute "
            "(every column, absolute microseconds included), lgbm-small (30 depth-3 trees "
            "alone), rf, or tuned-lgbm / tuned-rf (optuna)."
        ),
        seed: int = typer.Option(0, "--seed", help="Seeds scenarios and estimators."),
        n_trials: int = typer.Option(10, "--trials", min=1,
                                     help="Optuna trials (tuned-* only)."),
        storage: str = typer.Option(
            None, "--storage", help="Optuna RDB URL shared by several processes, "
            "e.g. sqlite:///study.db (tuned-* only; opened before training starts)."
        ),
        study: str = typer.Option(None, "--study", help="Optuna study name (tuned-* only)."),
    ) -> None:
        """Train a detector and save it as a checked model envelope with its metrics.

        Examples:

          holmes train --preset default --out holmes_ml/data/default-model.holmes   (the bundled model)

          holmes train labelled/ --estimator tuned-rf --trials 30 --storage sqlite:///study.db --study s1

        Several processes given the same --storage and --study tune one optuna study together.
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
                _check_storage(storage)
            det = TunedDetector(estimator.split("-")[1], n_trials=n_trials, storage=storage,
                                study_name=study, random_state=seed)
        else:
            raise typer.BadParameter(
                f"got {estimator!r}; expected lgbm, lgbm-unscreened, lgbm-absolute, lgbm-small, rf, "
                "tuned-lgbm or tuned-rf",
                param_hint="--estimator",
            )
        if not estimator.startswith("tuned-") and (storage is not None or study is not None):
            # Refused rather than ignored: the user expects the trials in a shared study.
            option = "--storage" if storage is not None else "--study"
            raise ValueError(f"{option} is only used by --estimator tuned-lgbm or tuned-rf "
                             f"(got --estimator {estimator}); drop it or pick a tuned estimator")
        if paths:
            metrics = _train_on_logs(paths, det, out, format)
        else:
            metrics = train_default(out, preset=preset, seed=seed, estimator=det)
        size = out.stat().st_size
        typer.echo(f"wrote {out} ({size / 1e6:.2f} MB)")
        for k, v in metrics.items():
            typer.echo(f"  {k}: {v:.4g}")


def _check_storage(url: str) -> None:
    """Open the optuna storage now: a typo, a missing directory or driver, or an unreachable
    database fails here instead of after the training data was built."""
    import optuna

    try:
        optuna.storages.RDBStorage(url).engine.dispose()
    except Exception as exc:  # noqa: BLE001 - sqlalchemy and the drivers raise many kinds
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"--storage {url!r}: cannot open it as an optuna storage ({why}); "
                         "expected a database URL that opens, e.g. sqlite:///study.db") from exc


def _train_on_logs(paths: list[Path], det, out: Path, format: str) -> dict[str, float]:
    """Fit ``det`` on labelled logs; F1 is measured on the last fifth of the iterations."""
    import numpy as np
    from sklearn.metrics import f1_score

    from holmes_ml import pipeline
    from holmes_ml.features import build_features
    from holmes_ml.models import save_model

    files, _ = pipeline.resolve_paths(paths)
    ops = pipeline.read_paths(files, format)
    if "abnormal" not in ops.columns:
        raise typer.BadParameter(
            f"{', '.join(map(str, paths))}: no 'abnormal' column; training needs op-level labels "
            "(true = a fault prolonged the op beyond its normal spread), e.g. from "
            "`holmes simulate`",
            param_hint="PATHS",
        )
    y = ops["abnormal"].to_numpy(dtype=bool)
    if y.all() or not y.any():
        raise typer.BadParameter(
            f"{', '.join(map(str, paths))}: every op is labelled abnormal={bool(y[0])}; a "
            "detector learns from both kinds (simulate jobs with a fault, or add healthy logs)",
            param_hint="PATHS",
        )
    X = build_features(ops)
    cut = np.quantile(ops["iteration"].to_numpy(), 0.8)
    held = ops["iteration"].to_numpy() > cut
    metrics: dict[str, float] = {"train_rows": float((~held).sum())}
    if held.any() and (~held).any() and y[~held].any():
        det.fit(X[~held], y[~held])
        metrics["heldout_f1"] = float(f1_score(y[held], det.predict(X[held]).astype(bool)))
    det.fit(X, y)
    save_model(det, out, metrics=metrics, training_data=(X, y), extra={"sources": list(map(str, paths))})
    return metrics
