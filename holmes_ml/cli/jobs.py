"""``holmes jobs [JOB] --server URL``: read (and manage) what a ``holmes serve`` knows."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table

from holmes_ml._text import few
from holmes_ml.cli._verdict import print_verdict


class ServiceError(ValueError):
    """The service refused a request or answered something else than its API says; the
    message names the URL, the status and the service's reason. Exit status 2, as for any
    input the command was given (an unknown job, a name it refuses)."""

    exit_code = 2


class Unavailable(ServiceError):
    """No service answered, or it failed (5xx): exit status 1, as ``holmes agent --once``
    exits when it cannot deliver, so that a script tells "try again" from "fix the command"
    (2: a wrong --server, token or job)."""

    exit_code = 1


def register(app: typer.Typer) -> None:
    """Add ``jobs`` to ``app``."""

    @app.command("jobs")
    def jobs(
        job: str = typer.Argument(None, help="A job to show the verdict of (default: list "
                                  "every job with its top suspect).", show_default=False),
        server: str = typer.Option("http://127.0.0.1:8787", "--server",
                                   help="Base URL of the `holmes serve` (its printed "
                                   "'listening on' URL)."),
        as_json: bool = typer.Option(False, "--json", help="Print the service's JSON answer "
                                     "(the job list, or the job's verdict) instead of tables."),
        analyze: bool = typer.Option(False, "--analyze", help="With JOB: have the service "
                                     "localize the job now, when data or a topology arrived "
                                     "since its verdict, instead of at its next background "
                                     "pass (an unchanged job keeps its verdict: the same data "
                                     "gives the same one; a write: needs --token when the "
                                     "service has one)."),
        delete: bool = typer.Option(False, "--delete", help="With JOB: delete the job and "
                                    "everything the service stored for it (a write: needs "
                                    "--token when the service has one)."),
        token: str = typer.Option(None, "--token", envvar="HOLMES_SERVE_TOKEN",
                                  help="Bearer token of the service (its --token), for "
                                  "--analyze and --delete."),
        timeout: float = typer.Option(60.0, "--timeout", min=0.1, help="Seconds to wait for "
                                      "the service's answer (--analyze waits for the "
                                      "localization)."),
        watch: float = typer.Option(None, "--watch", min=0.5, show_default=False,
                                    help="Ask again every this many seconds until Ctrl-C, "
                                    "redrawing the view in place on a terminal (elsewhere, and "
                                    "with --json, printing it again each time the answer "
                                    "changes: with --json one line each); a service that "
                                    "stops answering is said in the view, and watched on."),
    ) -> None:
        """What a running `holmes serve` knows: its jobs, or one job's verdict.

        Examples:

        * `holmes jobs --server http://svc:8787` — every job, its data and its top suspect;

        * `holmes jobs job7 --server http://svc:8787` — job7's verdict, shown as `holmes
        localize` shows one (`--json`: the service's answer as it is);

        * `holmes jobs job7 --analyze --token $T` — localize job7 now, then show it;

        * `holmes jobs job7 --delete --token $T` — forget a finished job;

        * `holmes jobs job7 --watch 10` — its verdict, asked for again every 10 s.

        Exit status: 0 answered; 1 no service answered, or it failed (5xx), or JOB has no
        verdict yet (no data yet, not localized yet, or its localization failed: a line
        says which, on stderr with --json): try again; 2 what was given is wrong (an
        unknown job, a refused token, a --server that is no holmes serve). The list shows
        such a job's suspect as "no verdict yet" rather than none. With --watch: 0 once
        stopped, 2 as above at the first call.
        """
        if (analyze or delete) and job is None:
            raise ValueError(f"--{'analyze' if analyze else 'delete'}: expected a JOB "
                             "argument (which job?)")
        if analyze and delete:
            raise ValueError("--analyze and --delete: expected one of them, not both")
        if watch is not None and (analyze or delete):
            raise ValueError(f"--watch and --{'analyze' if analyze else 'delete'}: expected "
                             "one of them, not both (the service localizes a watched job as "
                             "its data arrives)")
        if job is not None:
            from holmes_ml.serve import check_name

            check_name("JOB", job)
        client = _Client(server, token, timeout)
        console = Console()
        path = f"/v1/jobs/{quote(job, safe='')}" if job is not None else ""
        if delete:
            answer = client.call("DELETE", path)
            rows = ", ".join(f"{t} {n:,}" for t, n in sorted(answer["deleted"].items()))
            typer.echo(json.dumps(answer) if as_json else f"deleted job {job} ({rows} rows)")
            return
        if analyze:
            client.call("POST", f"{path}/analyze")
        if watch is not None:
            _watch(lambda: _view(client, job, path, server, not as_json), watch, as_json,
                   console)
            return
        answer, render, none = _view(client, job, path, server, not as_json)
        if as_json:
            typer.echo(json.dumps(answer))
            if none is not None:
                # stdout stays the service's answer alone; the status says "no verdict yet"
                typer.echo(none, err=True)
                raise typer.Exit(1)
            return
        render(console)
        if none is not None:
            raise typer.Exit(1)  # not known yet: try again, as for a service that failed


def _view(client: _Client, job: str | None, path: str, server: str, tables: bool = True
          ) -> tuple[Any, Callable[[Console], None], str | None]:
    """What ``holmes jobs [JOB]`` shows: the service's answer (what ``--json`` prints), how to
    print it as tables (with what else they show: JOB's sources, asked for only with
    ``tables``), and the line saying JOB has no verdict yet (None: it has one, or no JOB was
    given)."""
    if job is None:
        listed = client.call("GET", "/v1/jobs")
        return listed, lambda console: _print_jobs(listed, server, console), None
    verdict = client.call("GET", f"{path}/verdict")
    sources = (client.call("GET", path).get("sources") or []) if tables else []

    def render(console: Console) -> None:
        _print_job_verdict(verdict, console)
        _print_sources(sources, console)

    return verdict, render, _no_verdict(verdict)


def _watch(view: Callable[[], tuple[Any, Callable[[Console], None], str | None]],
           every: float, as_json: bool, console: Console) -> None:
    """Show ``view()`` every ``every`` seconds until Ctrl-C (or SIGTERM): redrawn in place on
    a terminal, else printed again when the answer changed (with ``as_json``, one JSON line
    each; what went wrong on stderr). What was given wrong (exit 2: an unknown job, a refused
    token) ends it at the first call; a later failure, or a service that stops answering, is
    said once and watched on."""
    import signal

    from rich.live import Live
    from rich.text import Text

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    shown: Any = None  # the last answer shown
    render: Callable[[Console], None] | None = None
    failing: str | None = None  # what went wrong at the last call
    calls = 0
    live = Live(console=console, auto_refresh=False) if console.is_terminal and not as_json \
        else None
    try:
        with live if live is not None else contextlib.nullcontext():
            while True:
                at = datetime.now().isoformat(sep=" ", timespec="seconds")
                try:
                    answer, render, _ = view()
                    failed = None
                except ServiceError as exc:
                    if not calls and not isinstance(exc, Unavailable):
                        raise  # a wrong job, token or --server: fix the command
                    answer, failed = shown, str(exc)
                calls += 1
                if live is not None:
                    head = f"holmes jobs, every {every:g} s: {at} (Ctrl-C to stop)"
                    # (printed apart: what the live console prints is the live view's)
                    text = io.StringIO()
                    if render is not None:
                        render(Console(file=text, width=console.width, force_terminal=True))
                    live.update(Group(
                        *([Text(failed, style="red")] if failed else []), Text(head),
                        Text.from_ansi(text.getvalue())), refresh=True)
                elif failed != failing:  # (with --json stdout is the answers', this stderr)
                    (Console(stderr=True) if as_json else console).print(
                        f"{at}: " + (f"[red]{escape(failed)}[/red]" if failed
                                     else "answering again"))
                if live is None and failed is None and answer != shown and render:
                    if as_json:
                        typer.echo(json.dumps(answer))
                    else:
                        console.rule(at)
                        render(console)
                shown, failing = answer, failed
                time.sleep(every)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Client:
    """Requests to one service, with every failure turned into one readable error."""

    def __init__(self, server: str, token: str | None, timeout: float) -> None:
        from holmes_ml.serve import require_extra

        self.httpx = require_extra("httpx")
        self.server = server.rstrip("/")
        if not self.server.startswith(("http://", "https://")):
            raise ValueError(f"--server {server!r}: expected an http:// or https:// URL, as "
                             "holmes serve prints it")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout

    def call(self, method: str, path: str) -> Any:
        url = self.server + path
        try:
            r = self.httpx.request(method, url, headers=self.headers, timeout=self.timeout)
        except self.httpx.HTTPError as exc:
            from holmes_ml.serve import plain_http_hint

            hint = plain_http_hint(self.server, str(exc))
            if hint:
                raise ServiceError(f"{method} {url}: {hint}") from None
            raise Unavailable(f"{method} {url}: no answer ({type(exc).__name__}: {exc}); "
                               "expected a running holmes serve there (see --server)") from None
        if r.status_code == 401:
            raise ServiceError(
                f"{method} {url}: the service refused the token given; expected its --token"
                if "Authorization" in self.headers else
                f"{method} {url}: the service needs its token for this; pass --token (or set "
                "HOLMES_SERVE_TOKEN)")
        try:
            body = r.json()
        except ValueError:
            raise ServiceError(f"{method} {url}: HTTP {r.status_code}, not JSON "
                               f"({r.text[:200]!r}); expected a holmes serve answer") from None
        if r.status_code >= 400:
            why = body.get("detail") if isinstance(body, dict) else body
            if isinstance(why, str):
                # the service's hint names its endpoint; a CLI user lists jobs with the CLI
                why = why.replace("list jobs with GET /v1/jobs",
                                  f"list them with holmes jobs --server {self.server}")
            error = Unavailable if r.status_code >= 500 else ServiceError
            raise error(f"{method} {url}: HTTP {r.status_code}: {why}")
        return body


def _ago(at: float | None, stamp: bool = True) -> str:
    """An epoch time as "5 min ago (2026-11-27 23:45:57)", in this machine's time zone (the
    time in brackets only with ``stamp``)."""
    if not at:
        return "never"
    seconds = max(0.0, time.time() - at)
    unit, size = next(((u, n) for u, n in (("d", 86400), ("h", 3600), ("min", 60))
                       if seconds >= 2 * n), ("s", 1))
    ago = f"{seconds / size:.0f} {unit} ago"
    if not stamp:
        return ago
    return f"{ago} ({datetime.fromtimestamp(at).isoformat(sep=' ', timespec='seconds')})"


def verdict_state(verdict: dict[str, Any]) -> str:
    """``state`` of a verdict answer (``analysed``, ``no_data``, ``pending``, ``failed``:
    :data:`holmes_ml.serve.schemas.VerdictState`); of a service answering without it (an
    older version), told from ``version`` (0: none) and ``error``."""
    state = verdict.get("state")
    if state:
        return str(state)
    if verdict.get("version"):
        return "analysed"
    return "failed" if verdict.get("error") else "pending"


def _no_verdict(verdict: dict[str, Any]) -> str | None:
    """The line saying that the job of ``verdict`` has no verdict yet, and why (``None``: it
    has one)."""
    state = verdict_state(verdict)
    if state == "analysed":
        return None
    if state == "no_data":
        why = "no data has come for it yet (only its topology); its agents' batches start it"
    elif state == "failed":
        why = str(verdict.get("error") or "localizing its data failed")
    else:
        why = ("its data has not been localized yet (the service localizes a job after its "
               "data arrives, unless started with --analyze-every 0; --analyze asks for it "
               "now)")
    return f"job {verdict['job']}: no verdict yet: {why}"


#: The suspect column of `holmes jobs` for a job without a verdict, by its verdict_state.
_NO_SUSPECT_YET = {"no_data": "[yellow]no verdict: no data yet[/yellow]",
                   "pending": "[yellow]no verdict yet[/yellow]",
                   "failed": "[red]no verdict: localization failed[/red]"}


def _print_jobs(listed: list[dict[str, Any]], server: str, console: Console) -> None:
    if not listed:
        console.print(f"no jobs at {server} yet: agents create one with their first batch")
        return
    table = Table(title=f"jobs at {server}")
    for col in ("job", "mode", "records", "batches (sources)", "last data", "top suspect",
                "score"):
        table.add_column(col, overflow="fold")
    for j in listed:
        top = j.get("top")
        suspect = "-"
        if top:
            suspect = top["device"] or top["kind"]
            if top.get("tied_with"):
                n = len(top["tied_with"])
                suspect += f" (tied with {n} other{'s' * (n != 1)})"
        sources = j.get("sources") or []
        lagging = sum(bool(x.get("lagging")) for x in sources)
        unread = sum(bool(x.get("rows_set_aside") or x.get("files_refused")) for x in sources)
        shown = escape(suspect)
        if not top and j.get("verdict_state") in _NO_SUSPECT_YET:
            # "-" reads as "none to blame": not known yet is something else
            shown = _NO_SUSPECT_YET[j["verdict_state"]]
        table.add_row(j["job"], j["mode"], f"{j['records']:,}",
                      f"{j['batches']:,} ({len(sources)}"
                      + (f", [red]{lagging} lagging[/red]" if lagging else "")
                      + (f", [yellow]{unread} with unread logs[/yellow]" if unread else "")
                      + ")",
                      _ago(j.get("last_ingest_at"), stamp=False), shown,
                      f"{top['score']:.3f}" if top else "")
    console.print(table)


def _print_sources(sources: list[dict[str, Any]], console: Console) -> None:
    """Who delivers the job's data, and a warning for each source that stopped."""
    if not sources:
        return
    lagging = [x for x in sources if x.get("lagging")]
    names = escape(few((x["source"] for x in sources), 6, ", "))
    console.print(f"sources: {len(sources)} ({names}); "
                  + (f"[red]{len(lagging)} lagging[/red]" if lagging else "all delivering"))
    for x in lagging:
        console.print(f"[red]lagging[/red]: {escape(x['source'])} last delivered "
                      f"{_ago(x['last_at'])}, up to iteration {x['last_iteration']} "
                      f"({x['behind_iterations']:,} behind the job): its agent may be down or "
                      "its ranks silent, and the verdict reads nothing newer of them")
    for x in sources:
        # what an agent could not read of its logs is missing from the verdict's evidence
        source = escape(x["source"])
        for f in x.get("files_refused") or ():
            console.print(f"[red]unread[/red]: {source}: {escape(f['file'])}: "
                          f"{escape(f['why'])} (the agent refuses it whole until it changes)")
        if x.get("rows_set_aside"):
            files = x.get("files_set_aside") or []
            worst = files[0] if files else None
            console.print(f"[yellow]set aside[/yellow]: {source}: "
                          f"{x['rows_set_aside']:,} row(s) of its logs unreadable, the rest "
                          "shipped" + (f"; most in {escape(worst['file'])} ({worst['rows']:,}), "
                                       f"latest: {escape(worst['why'])}" if worst else ""))


def _print_job_verdict(verdict: dict[str, Any], console: Console) -> None:
    job = verdict["job"]
    none = _no_verdict(verdict)
    if none is not None:
        # (a failed localization's error is in the line)
        console.print(escape(none).replace("no verdict yet", "[yellow]no verdict yet[/yellow]",
                                           1))
        return
    stale = ("; newer data has arrived since" if verdict.get("stale") else "")
    console.print(f"job {job}: verdict {verdict['version']}, computed "
                  f"{_ago(verdict['computed_at'])} from {verdict['data_batches']:,} "
                  f"batch(es){stale}")
    if verdict.get("error"):
        console.print(f"[red]error[/red]: {escape(str(verdict['error']))} (the verdict "
                      "shown is of older data)")
    print_verdict(verdict, console)
