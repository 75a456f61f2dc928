"""``holmes train``: train a detector on simulator scenarios or labelled logs, save an envelope."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add ``holmes train`` to ``app``."""

    @app.command("train")
    def train(
        out: Path = typer.Option(Path("model.holmes"), "--out", help="Model envelope to write."),
        preset: str = typer.Option(
            "default", "--preset", help="Simulator scenario mix: default, quick or tiny."
        ),
        estimator: str = typer.Option(
            "lgbm", "--estimator", help="lgbm, rf, or tuned-lgbm / tuned-rf (optuna)."
        ),
        seed: int = typer.Option(0, "--seed", help="Seeds scenarios and estimators."),
        n_trials: int = typer.Option(10, "--trials", help="Optuna trials (tuned-* only)."),
        storage: str = typer.Option(
            None, "--storage", help="Optuna RDB URL shared by several processes, "
            "e.g. sqlite:///study.db (tuned-* only)."
        ),
        study: str = typer.Option(None, "--study", help="Optuna study name (tuned-* only)."),
    ) -> None:
        """Train a detector reproducibly on simulated scenarios and save it with its metrics."""
        from holmes_ml.models import RandomForestDetector, TunedDetector
        from holmes_ml.models.training import PRESETS, default_estimator, train_default

        if preset not in PRESETS:
            raise typer.BadParameter(f"got {preset!r}; expected one of {sorted(PRESETS)}",
                                     param_hint="--preset")
        if estimator == "lgbm":
            det = default_estimator(seed)
        elif estimator == "rf":
            det = RandomForestDetector(n_estimators=60, max_depth=14, min_samples_leaf=5,
                                       threshold="auto", random_state=seed)
        elif estimator in ("tuned-lgbm", "tuned-rf"):
            det = TunedDetector(estimator.split("-")[1], n_trials=n_trials, storage=storage,
                                study_name=study, random_state=seed)
        else:
            raise typer.BadParameter(
                f"got {estimator!r}; expected lgbm, rf, tuned-lgbm or tuned-rf",
                param_hint="--estimator",
            )
        metrics = train_default(out, preset=preset, seed=seed, estimator=det)
        size = out.stat().st_size
        typer.echo(f"wrote {out} ({size / 1e6:.2f} MB)")
        for k, v in metrics.items():
            typer.echo(f"  {k}: {v:.4g}")
