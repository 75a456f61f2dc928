"""``holmes detect``: per-op abnormality scores and the irregular iterations of CommOps logs."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add ``holmes detect`` to ``app``."""

    @app.command("detect")
    def detect(
        paths: list[Path] = typer.Argument(..., help="CommOps logs (any supported format)."),
        model: Path = typer.Option(None, "--model", help="Model envelope (default: shipped)."),
        format: str = typer.Option("auto", "--format", help="Input format (default: detect)."),
        out: Path = typer.Option(
            Path("scores.parquet"), "--out", help="Parquet of the ops with a `score` column."
        ),
    ) -> None:
        """Score every operator and print the delta-irregular iterations."""
        from holmes_ml.features import detect_irregular
        from holmes_ml.io import read_ops
        from holmes_ml.models import ModelFileError, load_model, score_ops

        try:
            det = load_model(model) if model is not None else None
        except ModelFileError as exc:
            raise typer.BadParameter(str(exc), param_hint="--model") from exc
        ops = read_ops([str(p) for p in paths], format=format)
        scores = score_ops(ops, model=det)
        threshold = float(getattr(det, "threshold_", 0.5)) if det is not None else None
        if threshold is None:
            from holmes_ml.models import default_model

            threshold = float(getattr(default_model(), "threshold_", 0.5))
        table = ops.assign(score=scores, predicted=scores >= threshold)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(out, index=False)
        it = detect_irregular(ops)
        irregular = it.index[it["irregular"].to_numpy(dtype=bool)].tolist()
        typer.echo(f"scored {len(ops)} ops ({int(table['predicted'].sum())} abnormal at "
                   f"threshold {threshold:.3f}) -> {out}")
        typer.echo("irregular iterations: " + (" ".join(map(str, irregular)) or "none"))
