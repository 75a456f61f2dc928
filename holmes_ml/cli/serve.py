"""``holmes serve`` (the central service) and ``holmes agent`` (one per node)."""

from __future__ import annotations

import ipaddress
import math
import os
import signal
import socket
from pathlib import Path

import typer

#: Smallest --max-body-mb: the service refuses limits under 1 KiB (an agent batch is larger).
MIN_BODY_MB = 0.001


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``agent`` to ``app``."""

    @app.command("serve")
    def serve_cmd(
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; any but a "
                                 "loopback address needs a --token."),
        port: int = typer.Option(8787, "--port",
                                 help="TCP port to listen on (1-65535); agents' --server "
                                 "points here."),
        db: Path = typer.Option(Path("holmes-serve.db"), "--db", help="SQLite database file "
                                "(created, with its directories, when missing; must be a holmes serve database)."),
        token: str = typer.Option(None, "--token", envvar="HOLMES_SERVE_TOKEN",
                                  help="Bearer token required for writes (not empty; "
                                  "without one only a loopback --host is allowed)."),
        model: Path = typer.Option(None, "--model", help="Detector file (holmes train "
                                   "output) used for raw-record jobs (default: the shipped "
                                   "model; 'rule' for the rule baseline)."),
        webhook: str = typer.Option(None, "--webhook", envvar="HOLMES_SERVE_WEBHOOK",
                                    help="http(s):// URL POSTed when a job's top candidate "
                                    "device changes or goes (JSON; see docs/deploy.md). Given "
                                    "in HOLMES_SERVE_WEBHOOK, a secret in it stays out of "
                                    "`ps`; logs show only its scheme, host and port."),
        max_body_mb: float = typer.Option(64.0, "--max-body-mb", help="Largest request body "
                                          "in MiB (also once gunzipped); at least 0.001."),
        large_at_once: int = typer.Option(2, "--large-at-once", help="Requests with a body of "
                                          "1 MiB or more handled at once; the others wait "
                                          "their turn. Parsed, a body costs 5-10x its "
                                          "size, so they take at most about N x 10 x the largest "
                                          "body."),
        analyze_every: float = typer.Option(2.0, "--analyze-every",
                                            help="Seconds between background localizations "
                                            "of jobs with new data (0: only on POST "
                                            "/v1/jobs/JOB/analyze)."),
        analyze_last: int = typer.Option(200, "--analyze-last", help="A verdict reads a "
                                         "job's this many most recent iterations, so it costs "
                                         "the same after a week as after a minute; older rows "
                                         "stay stored (0: every iteration). At least 70: the "
                                         "localizer looks at up to the 50 most recent, and "
                                         "the irregularity monitor judges each against the 20 "
                                         "regular ones before it (with fewer, a slowdown "
                                         "lasting those 50 is judged against fewer, or none "
                                         "and never flagged)."),
        keep_iterations: int = typer.Option(0, "--keep-iterations", help="After each "
                                            "verdict, delete a job's rows of iterations before "
                                            "its this many most recent ones, the records of "
                                            "the batches that held them and all but its 100 "
                                            "latest verdicts, so the database stops growing "
                                            "(0: keep everything; else at least "
                                            "--analyze-last)."),
    ) -> None:
        """Run the central service: ingest from agents, localize per job, REST + /metrics.

        Example: `holmes serve --db /var/lib/holmes/serve.db --token $T --host 0.0.0.0`
        """
        from holmes_ml.serve.app import BindError, ServeSettings, base_url, serve

        # Checked here, in the unit the user typed: the settings only see bytes.
        if not (math.isfinite(max_body_mb) and max_body_mb >= MIN_BODY_MB):
            raise ValueError(f"--max-body-mb {max_body_mb:g}: expected a finite size in MiB of "
                             f"at least {MIN_BODY_MB:g}")
        settings = ServeSettings(db=db, host=host, port=port, token=_token(token), model=model,
                                 webhook=webhook, max_body_bytes=int(max_body_mb * 2**20),
                                 max_large_requests=large_at_once,
                                 analyze_interval_s=analyze_every,
                                 analyze_last=analyze_last, keep_iterations=keep_iterations)
        settings.check()  # a ValueError naming the option: one `error:` line

        def ready(url: str) -> None:
            also = ""
            if _all_interfaces(host):
                # http://0.0.0.0:8787 is no address to give an agent: name this machine
                url = base_url(socket.gethostname(), port)
                also = (f"all interfaces, also {base_url('::1' if ':' in host else '127.0.0.1', port)}"
                        " from this machine; ")
            auth = ("writes need the --token" if settings.token
                    else "no --token: writes need none")
            typer.echo(f"holmes serve: listening on {url} ({also}db {db}; {auth}; agents POST "
                       f"{url}/v1/jobs/JOB/batches; API docs {url}/docs, metrics "
                       f"{url}/metrics; Ctrl-C stops)")

        # A --db that is not ours raises DatabaseFileError, a ValueError: the CLI prints it
        # in one line like any other bad input; so is a port in use, before the db is made.
        def stopped() -> None:
            typer.echo(f"holmes serve: stopped; what it accepted is kept in {db} (start it "
                       "again with the same --db to go on)", err=True)

        try:
            serve(settings, on_ready=ready, on_stopped=stopped)
        except BindError as exc:
            raise ValueError(str(exc)) from exc

    @app.command("agent")
    def agent_cmd(
        follow: Path = typer.Option(..., "--follow", file_okay=False,
                                    help="Directory of this node's per-rank CommOps logs "
                                    "(.arrows as the logger writes them, followed batch by "
                                    "batch; .jsonl, .csv; .parquet once closed; "
                                    "subdirectories too), or of "
                                    "its traces in another format (Kineto, Flight Recorder, "
                                    "NCCL Inspector, a ByteDance what-if trace with its meta "
                                    "yaml beside it). Not there yet: the agent waits for it "
                                    "(refused with --once)."),
        server: str = typer.Option("http://127.0.0.1:8787", "--server",
                                   help="Base URL of the central `holmes serve` (its printed "
                                   "'listening on' URL)."),
        job: str = typer.Option(..., "--job", help="Job name in the service."),
        token: str = typer.Option(None, "--token", envvar="HOLMES_SERVE_TOKEN",
                                  help="Bearer token of the service (its --token); default: "
                                  "none, for a service without one."),
        source: str = typer.Option(None, "--source", help="Agent name (default: "
                                   "$HOLMES_AGENT_SOURCE, else the host name)."),
        outbox: Path = typer.Option(None, "--outbox", help="Outbox database (default "
                                    "FOLLOW/.holmes-agent.db)."),
        model: Path = typer.Option(None, "--model", help="Detector file (default: the "
                                   "shipped model; 'rule' for the rule baseline)."),
        topology: Path = typer.Option(None, "--topology", help="topology.json (as `holmes "
                                      "simulate` writes it) to attach to the job."),
        poll: float = typer.Option(2.0, "--poll", help="Seconds between polls of the log "
                                   "directory (> 0)."),
        once: bool = typer.Option(False, "--once", help="Ship everything now and exit: 0 when "
                                  "all was sent, 1 when the service could not be reached in "
                                  "--retry-for seconds, answered as no holmes serve would "
                                  "(a wrong --server: a 404, a proxy's page) or refused "
                                  "something (unsent batches stay in the outbox for the next "
                                  "run), 2 when a log file "
                                  "or some of its rows could not be read (the rest is "
                                  "shipped, each bad row named by its line) or there is "
                                  "no log (2 also when 1 applies)."),
        retry_for: float = typer.Option(30.0, "--retry-for", help="With --once: seconds to "
                                        "keep retrying an unreachable service before giving "
                                        "up (without --once the agent retries forever)."),
        flush_after: float = typer.Option(30.0, "--flush-after", help="Seconds without new "
                                          "log rows after which each rank's last iteration "
                                          "(held back until a later one is logged) is shipped "
                                          "as it stands; rows of it logged later ship it "
                                          "again, whole (> 0)."),
        resend_rejected: bool = typer.Option(False, "--resend-rejected", help="Send again "
                                             "the batches the service refused in earlier "
                                             "runs (kept in the outbox, named at start), "
                                             "once the cause is fixed on the service's side, "
                                             "e.g. a job that held raw records deleted."),
        since: str = typer.Option(None, "--since", help="Read only the files written in this "
                                  "last while before the agent started: 90s, 30m, 6h, 2d "
                                  "(default: every file). For an agent started beside a job "
                                  "that has run for days: it ships the recent iterations, not "
                                  "every archive of rotated logs kept beside them. A file left "
                                  "out (the agent says how many) is read from its start once "
                                  "written again; logs an earlier run of this outbox read are "
                                  "read on whatever their age."),
    ) -> None:
        """Follow a node's CommOps logs and ship summaries to `holmes serve`.

        A few bad rows of a log (an unknown op, a torn line) are set aside, each named by its
        line, and the rows after them ship; a log file that cannot be read is reported (ERROR,
        naming the file) and skipped until it changes; the others keep being shipped. A log
        rotated by logrotate (renamed, or copytruncate) is read on in the rotated file beside it
        until that is gone, and the new one from its start; compressed archives of rotated logs
        (*.jsonl.gz, *.csv.gz) are each read once and ship no operator twice. SIGTERM or Ctrl-C
        queues what was read (each rank's last iteration too) and tries once more to send it
        before exiting; a second one exits at once (nothing queued is lost). Started again on
        its outbox, the agent reads each log on from a point the outbox kept, not from its start
        (a log rotated meanwhile is found beside its name). Started beside a job that has run
        for days, --since 6h leaves out the files not written in the last six hours.

        Example: `holmes agent --follow /logs/job7 --server http://svc:8787 --job job7 --token $T`
        """
        from holmes_ml.serve.agent import Agent, AgentConfig

        if not follow.exists():
            if once:
                raise typer.BadParameter(
                    f"{follow}: no such directory; expected this node's log directory (without "
                    "--once the agent waits for it to appear)", param_hint="--follow")
            if not _wait_for(follow, poll):
                return
        cfg = AgentConfig(follow=follow, server=server, job=job, token=_token(token),
                          source=source or os.environ.get("HOLMES_AGENT_SOURCE") or None,
                          outbox=outbox, poll_s=poll, once_retry_s=retry_for,
                          flush_after_s=flush_after, resend_rejected=resend_rejected,
                          since_s=None if since is None else _seconds("--since", since))
        cfg.check()  # before the model is loaded: a typo fails at once, in one `error:` line
        topo = None
        if topology is not None:
            topo = _read_topology(topology)
        loaded = None
        if model is not None and str(model) == "rule":
            loaded = "rule"  # the pipeline's rule baseline, no detector file
        elif model is not None:
            from holmes_ml.models import load_model

            loaded = load_model(model)
        agent = Agent(cfg, model=loaded,
                      say=lambda line: typer.echo(f"holmes agent: {line}", err=True))
        stopping: list[int] = []

        def stop_on(signum: int, _frame: object) -> None:
            # the first SIGTERM/SIGINT ends the loop at its next check, and the agent flushes;
            # a second one (a flush that hangs) interrupts at once
            if stopping:
                raise KeyboardInterrupt
            stopping.append(signum)

        previous = {sig: signal.signal(sig, stop_on) for sig in (signal.SIGTERM, signal.SIGINT)}
        interrupted = False
        try:
            if topo is not None:
                agent.attach_topology(topo)
            agent.run(once=once, stop=lambda: bool(stopping))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            unsent = agent.outbox.n_pending()
            agent.close()
        interrupted = interrupted or bool(stopping)
        s = agent.stats
        typer.echo(f"read {s.ops_read} ops ({s.raw_bytes} B), sent {s.batches_sent} batches "
                   f"({s.sent_bytes} B)")
        if not once:
            if unsent:
                typer.secho(f"warning: {unsent} batch{'es' if unsent != 1 else ''} kept in the "
                            f"outbox {cfg.outbox_path} ({agent.last_error or 'not sent yet'}); "
                            "run the agent again to send them", err=True,
                            fg=typer.colors.YELLOW)
            return
        status = 0
        if not agent.n_log_files and not agent.bad_files and not agent.too_old:
            typer.secho(f"error: {agent.no_logs_message}", err=True,
                        fg=typer.colors.RED)
            status = 2
        for path, why in agent.bad_files.items():
            typer.secho(f"error: {path}: {why}", err=True, fg=typer.colors.RED)
            status = 2
        for path, rows in agent.rows_set_aside.items():
            n = agent.n_set_aside[path]
            typer.secho(f"error: {path}: {n} row(s) set aside, the rest shipped: "
                        + "; ".join(rows[:3]) + (" ..." if n > 3 else ""), err=True,
                        fg=typer.colors.RED)
            status = 2
        if unsent or agent.topology_pending:
            what = f"{unsent} batch{'es' if unsent != 1 else ''}"
            if agent.topology_pending:
                what += " and the topology (not kept: pass --topology again)"
            why = ("interrupted" if interrupted
                   else f"service {server} refused the token ({agent.auth_refused}); check "
                   "--token / HOLMES_SERVE_TOKEN" if agent.auth_refused
                   else f"--server {server} answered as no holmes serve "
                   f"({agent.misconfigured}); expected the service's 'listening on' URL"
                   if agent.misconfigured
                   else f"service {server} unreachable for {retry_for:g} s "
                   f"({agent.last_error})")
            typer.secho(f"error: {why}: {what} kept in the outbox "
                        f"{cfg.outbox_path}; run the agent again to send them", err=True,
                        fg=typer.colors.RED)
            status = max(status, 1)  # an unreadable log (2) stays the first thing to fix
        if s.batches_rejected or agent.topology_refused:
            typer.secho(f"error: the service refused {s.batches_rejected} batch(es)"
                        + (" and the topology" if agent.topology_refused else "")
                        + f" (see the log above; refused batches are kept as 'rejected' in "
                        f"{cfg.outbox_path}; --resend-rejected sends them again once the "
                        "cause is fixed)", err=True, fg=typer.colors.RED)
            status = max(status, 1)
        if status:
            raise typer.Exit(status)


def _seconds(option: str, text: str) -> float:
    """``text``, a duration (:func:`holmes_ml._text.seconds_of`), in seconds; ``ValueError``
    naming ``option`` and the value otherwise."""
    from holmes_ml._text import seconds_of

    try:
        return seconds_of(text)
    except ValueError as exc:
        raise ValueError(f"{option} {exc}") from None


def _token(token: str | None) -> str | None:
    """``--token`` as given, or ``""`` when HOLMES_SERVE_TOKEN is set but empty (click takes
    an empty variable for an unset one): the settings refuse it rather than run without."""
    if token is None and os.environ.get("HOLMES_SERVE_TOKEN") == "":
        return ""
    return token


def _all_interfaces(host: str) -> bool:
    """Whether ``host`` (0.0.0.0, ::) binds every address of the machine."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _read_topology(path: Path) -> dict:
    """The topology file as the service expects it, or a one-line error naming the file."""
    from holmes_ml.io.schema import SchemaError
    from holmes_ml.topology import Topology

    try:
        return Topology.from_json(path).to_dict()
    except SchemaError:
        raise  # names the file and what was expected; the CLI prints it in one line
    except (ValueError, TypeError) as exc:
        # e.g. not UTF-8, or values of the wrong type inside an otherwise valid layout
        raise SchemaError(f"not a readable topology ({type(exc).__name__}: {exc})",
                          source=f"--topology {path}",
                          expected="a topology.json as holmes simulate writes it") from exc


def _wait_for(directory: Path, poll_s: float) -> bool:
    """Wait until ``directory`` exists (an agent started before the job's loggers made its
    log directory: a unit started at boot), saying so once; False when stopped meanwhile
    (Ctrl-C or SIGTERM), with nothing read or queued."""
    import time

    typer.echo(f"holmes agent: waiting for {directory} to appear (the job's loggers make it "
               "when they start); Ctrl-C stops", err=True)
    stopped: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: stopped.append(signum))
    try:
        while not directory.exists() and not stopped:
            time.sleep(min(max(poll_s, 0.05), 1.0))
    except KeyboardInterrupt:
        stopped.append(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped:
        typer.echo(f"holmes agent: stopped before {directory} appeared; nothing read", err=True)
        return False
    if not directory.is_dir():
        raise typer.BadParameter(f"{directory}: appeared as a file; expected a directory",
                                 param_hint="--follow")
    return True
