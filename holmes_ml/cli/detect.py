"""``holmes detect PATH...``: score every operator and find the irregular iterations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from holmes_ml.cli._checks import (
    TRUST_PICKLE_HELP,
    bad_labels,
    check_delta,
    check_not_input,
    check_writable,
    format_help,
    format_option,
    op_named,
)
from holmes_ml.io._common import stage
from holmes_ml.io.schema import SchemaError


def register(app: typer.Typer) -> None:
    """Add ``holmes detect`` to ``app``."""

    @app.command("detect")
    def detect(
        paths: list[Path] = typer.Argument(
            ..., help="Log files or a simulator output directory.", show_default=False
        ),
        model: Path | None = typer.Option(
            None, "--model", help="Detector file (default: the bundled model). 'rule' scores "
            "with the 3-sigma + rule baseline instead (0.5 at its abnormality bar)."
        ),
        format: str = typer.Option("auto", "--format", help=format_help(),
                                   callback=format_option),
        trust_pickle: bool = typer.Option(False, "--trust-pickle", help=TRUST_PICKLE_HELP),
        delta: float = typer.Option(
            1.1, "--delta",
            help="Irregularity factor (finite, > 1): an iteration this many times longer than "
            "its robust reference is irregular (below ~1.04 jitter swamps the signal).",
        ),
        threshold: float | None = typer.Option(
            None, "--threshold", min=0.0, max=1.0,
            help="Score at or above which an op is abnormal (default: the model's own, picked "
            "when it was trained).",
        ),
        out: Path = typer.Option(
            Path("scores.parquet"), "--out",
            help="Parquet of the ops with `score` and `predicted` columns.",
        ),
        iterations_out: Path | None = typer.Option(
            None, "--iterations-out",
            help="CSV of the iterations, one row each: iteration, start_ns, end_ns, "
            "duration_s / time_us (as the monitor times it), n_ops, end_to_end, reference_s / "
            "reference_us, ratio, irregular, episode, pattern (default: beside --out, "
            "`<stem>.iterations.csv`).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Score every operator (P(abnormal)) and flag the delta-irregular iterations.

        Writes the scored ops and the iteration table, then prints the irregular episodes
        (spike, fluctuation or persistent) and the ranks with most abnormal ops. Those are
        where the slowness shows, not necessarily its cause (a straggler's own ops look normal
        while its peers wait): `holmes localize` on the same logs names the device.

        Logs that carry an `abnormal` label column (`holmes simulate` writes one; so can your
        own labelled traces) are also scored against it: precision, recall and F1 of the
        flagged ops, as `holmes train` reports them; how to compare detectors on held-out jobs.

        Examples: `holmes detect sim/` (a `holmes simulate` output directory; writes
        `scores.parquet` and `scores.iterations.csv`); `holmes detect traces/ --format kineto
        --model my.holmes --json`.
        """
        from holmes_ml import pipeline
        from holmes_ml.features import IrregularityConfig, detect_irregular
        from holmes_ml.models import default_model, load_model, score_ops

        check_delta(delta)
        iterations_out = iterations_out or out.with_name(out.stem + ".iterations.csv")
        check_writable(out, "--out")
        check_writable(iterations_out, "--iterations-out")
        check_not_input(out, "--out", paths)
        check_not_input(iterations_out, "--iterations-out", paths)
        if iterations_out.resolve() == out.resolve():
            raise ValueError(f"--iterations-out {iterations_out}: the same file as --out; "
                             "expected another file name (the scores would be overwritten)")
        if out.suffix.lower() in (".csv", ".json", ".jsonl"):
            raise ValueError(f"--out {out}: a {out.suffix} name for a Parquet file; expected a "
                             "name ending in .parquet")
        # 'rule' as in `holmes localize` and `holmes agent`: the baseline, no detector file
        rule = model is not None and str(model) == "rule"
        det = None if rule else load_model(model) if model is not None else default_model()
        files, _ = pipeline.resolve_paths(paths)
        ops = pipeline.read_paths(files, format, progress=sys.stderr.isatty(),
                                  trust_pickle=trust_pickle)
        labels = _read_labels(ops, ", ".join(map(str, paths)))
        with stage(f"scoring {len(ops):,} operators", show=sys.stderr.isatty()):
            scores = pipeline.rule_scores(ops) if rule else score_ops(ops, model=det)
        cut = threshold if threshold is not None else float(getattr(det, "threshold_", 0.5))
        table = ops.assign(score=scores, predicted=scores >= cut)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(out, index=False)
        its = detect_irregular(ops, IrregularityConfig(delta=delta))
        iterations_out.parent.mkdir(parents=True, exist_ok=True)
        its.to_csv(iterations_out)
        report = _report(table, its, cut, out, iterations_out)
        report["labels"] = _against_labels(labels, table["predicted"].to_numpy(dtype=bool))
        # which scores these are: comparing models means keeping that beside the figures
        report["model"] = "rule" if rule else str(model.resolve()) if model else "bundled"
        if as_json:
            typer.echo(json.dumps(report))
        else:
            _print(report)


def _report(table, its, threshold: float, out: Path, iterations_out: Path) -> dict:
    """What ``holmes detect`` found, as plain JSON-able values."""
    irregular = its.index[its["irregular"].to_numpy(dtype=bool)]
    episodes = []
    for ep, rows in its[its["episode"] >= 0].groupby("episode"):
        episodes.append({"episode": int(ep), "pattern": str(rows["pattern"].iloc[0]),
                         "first": int(rows.index.min()), "last": int(rows.index.max()),
                         "iterations": len(rows), "peak_ratio": round(float(rows["ratio"].max()),
                                                                       4)})
    flagged = table[table["predicted"].to_numpy(dtype=bool)]
    per_rank = flagged.groupby("rank").size().sort_values(ascending=False, kind="stable")
    return {
        "ops": len(table), "abnormal_ops": len(flagged), "threshold": round(threshold, 6),
        "irregular_iterations": [int(i) for i in irregular],
        "episodes": episodes,
        "top_ranks": [{"rank": int(r), "abnormal_ops": int(n)} for r, n in per_rank[:5].items()],
        "labels": None,
        "scores": str(out), "iterations": str(iterations_out),
    }


def _read_labels(ops, source: str):  # noqa: ANN001, ANN202 - a DataFrame in, arrays out
    """``(truth, known)`` from the logs' own ``abnormal`` column, ``None`` without one.

    Rows without a label (files of which only some are labelled) are not ``known``; a value
    that is not true/false/1/0 is refused naming ``source``, not read as ``True``.
    """
    if "abnormal" not in ops.columns:
        return None
    label = ops["abnormal"]
    known = label.notna().to_numpy()
    if not known.any():
        return None
    truth, bad = bad_labels(label[known])
    if bad.any():
        first = ops[known].iloc[int(bad.argmax())]
        raise SchemaError(f"{int(bad.sum()):,} of {int(known.sum()):,} labels are not a boolean"
                          f", the first of {op_named(first)}",
                          source=source, column="abnormal", value=first["abnormal"],
                          expected="true/false/1/0 (case-insensitive), or no abnormal column")
    return truth, known


def _against_labels(labels, predicted) -> dict | None:  # noqa: ANN001 - numpy arrays
    """The flagged ops (``predicted``) scored against ``labels`` (from :func:`_read_labels`).

    A figure with nothing to divide by is ``None``, not 0: precision when no op was flagged,
    recall when none is labelled abnormal, F1 when neither (a healthy job left alone), so an
    average over jobs can leave them out rather than count a perfect healthy job as F1 0.
    """
    if labels is None:
        return None
    truth, known = labels
    pred = predicted[known]
    tp = int((pred & truth).sum())
    fp, fn = int((pred & ~truth).sum()), int((truth & ~pred).sum())

    def share(num: int, den: int) -> float | None:
        return round(num / den, 4) if den else None

    return {
        "column": "abnormal", "labelled_ops": int(known.sum()),
        "unlabelled_ops": int((~known).sum()), "abnormal": int(truth.sum()),
        "precision": share(tp, tp + fp), "recall": share(tp, tp + fn),
        "f1": share(2 * tp, 2 * tp + fp + fn), "false_alarms": fp, "missed": fn,
    }


def _print(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from holmes_ml._text import spans

    console = Console()
    console.print(f"scored {report['ops']} ops ({report['abnormal_ops']} abnormal at threshold "
                  f"{report['threshold']:.3f}) -> {report['scores']}; iterations -> "
                  f"{report['iterations']}")
    console.print("irregular iterations: " + spans(report["irregular_iterations"]))
    if report["episodes"]:
        table = Table(title="irregular episodes")
        for col in ("#", "pattern", "iterations", "peak ratio"):
            table.add_column(col)
        for e in report["episodes"]:
            span = str(e["first"]) if e["first"] == e["last"] else f"{e['first']}-{e['last']}"
            table.add_row(str(e["episode"]), e["pattern"], span, f"{e['peak_ratio']:.2f}")
        console.print(table)
    if report["top_ranks"]:
        console.print("ranks with most abnormal ops: " + ", ".join(
            f"{r['rank']} ({r['abnormal_ops']})" for r in report["top_ranks"]))
        console.print("(where the slowness shows, not necessarily its cause: a straggler's own "
                      "ops look normal while its peers wait; `holmes localize` names the device)")
    lab = report["labels"]
    if lab is not None:
        skipped = f", {lab['unlabelled_ops']} unlabelled left out" if lab["unlabelled_ops"] else ""
        def fig(name: str) -> str:
            return "n/a" if lab[name] is None else f"{lab[name]:.3f}"

        console.print(f"against the logs' abnormal labels ({lab['abnormal']} of "
                      f"{lab['labelled_ops']} ops{skipped}): precision {fig('precision')}, "
                      f"recall {fig('recall')}, F1 {fig('f1')} ({lab['false_alarms']} "
                      f"false alarms, {lab['missed']} missed)")
