"""The central service: FastAPI app over a SQLite :class:`~holmes_ml.serve.store.Store`.

Writes (agent batches, raw records, topology, forced analysis) need ``Authorization: Bearer
<token>`` when a token is configured; the service refuses to bind a non-loopback address
without one. Every write is committed before it is acknowledged. Localization runs in a
background thread for jobs whose data changed since their last verdict, and can be forced with
``POST /v1/jobs/{job}/analyze``.

Endpoints: ``GET /healthz``, ``GET /metrics``, ``GET /v1/jobs``, ``GET /v1/jobs/{job}``,
``GET /v1/jobs/{job}/iterations``, ``GET /v1/jobs/{job}/verdict``,
``GET /v1/jobs/{job}/candidates``, ``POST /v1/jobs/{job}/batches`` (agent),
``POST /v1/jobs/{job}/raw``, ``PUT /v1/jobs/{job}/topology``, ``POST /v1/jobs/{job}/analyze``;
OpenAPI at ``/openapi.json`` and ``/docs``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import socket
import sqlite3
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd

from holmes_ml.serve import hold_lock, require_extra

require_extra("fastapi")
require_extra("prometheus_client")

import prometheus_client as prom  # noqa: E402
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request  # noqa: E402
from fastapi import Path as PathParam  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse, Response  # noqa: E402
from fastapi.routing import APIRoute  # noqa: E402
from prometheus_client.core import GaugeMetricFamily  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402
from starlette.routing import Match  # noqa: E402

from holmes_ml.io.schema import (  # noqa: E402
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    SchemaError,
    validate,
)
from holmes_ml.serve.engine import (  # noqa: E402
    Analyzers,
    compute_verdict,
    iteration_rows,
    min_analyze_last,
    pipeline_analyzers,
)
from holmes_ml.serve.schemas import (  # noqa: E402
    NAME_PATTERN,
    Ack,
    AgentBatch,
    Candidate,
    ErrorOut,
    IterationOut,
    JobDeleted,
    JobOut,
    RawBatch,
    RawColumns,
    SourceOut,
    TopologyIn,
    VerdictOut,
    VerdictState,
    finite,
)
from holmes_ml.serve.store import Store, StoreError, UnknownJobError  # noqa: E402
from holmes_ml.topology import Topology  # noqa: E402

logger = logging.getLogger(__name__)

#: Every :data:`~holmes_ml.serve.schemas.VerdictState`, in the order /metrics lists them.
VERDICT_STATES: tuple[VerdictState, ...] = ("analysed", "no_data", "pending", "failed")

DEFAULT_MAX_BODY = 64 * 2**20
#: A request body of at least this many bytes (inflated) is *large*: parsed into Python objects
#: it costs 5-10x its size (``scripts/body_memory.py``: 5.0x for a logger's records, 9.3x for
#: one-character values), so only
#: ``ServeSettings.max_large_requests`` of them are handled at once and the others wait.
LARGE_BODY = 2**20


def _is_json_type(content_type: str) -> bool:
    """Whether FastAPI reads a body of ``content_type`` as JSON: ``application/json`` or a
    ``+json`` type, parameters aside."""
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/")
                                           and main.endswith("+json"))


@dataclass(frozen=True)
class ServeSettings:
    """Configuration of ``holmes serve``.

    Parameters
    ----------
    db:
        SQLite database file (created when missing).
    host, port:
        Where to listen; anything but a loopback address needs ``token``.
    token:
        Bearer token required for writes (``None``: writes are open, loopback only).
    model:
        Detector file, loaded with :func:`holmes_ml.models.load_model` (raw-record jobs only;
        agents score on their node). ``None``: the pipeline's default model; ``rule``: the
        rule baseline.
    webhook:
        URL that receives a JSON POST when a job's top candidate device changes, and when a
        job that had one has none (delivered by :class:`WebhookSender`).
    max_body_bytes:
        Largest request body accepted (after gzip decompression too).
    max_large_requests:
        (``--large-at-once``) How many requests with a body of :data:`LARGE_BODY` bytes or
        more are parsed and stored at once; the others wait their turn (nothing is refused). A body parsed into Python
        objects costs 5-10x its size, so this bounds the service's memory when many
        agents or loggers upload at once (a backlog after an outage): about
        ``max_large_requests * 10 * max_body_bytes`` for them.
    analyze_interval_s:
        How often the background thread re-localizes jobs with new data (0: never; use
        ``POST /v1/jobs/{job}/analyze``).
    analyze_last:
        A verdict (and ``GET /v1/jobs/{job}/iterations`` by default) reads a job's this many
        most recent iterations: the localizer looks at the last 50 with abnormal operators (up
        to the last irregular one, when that comes before them) and the irregularity monitor
        at the 20 before each, so 200 leaves room, and the work per
        verdict stays the same however long the job has run. Older rows stay stored. 0: every
        iteration (the cost then grows with the job's age). Else at least
        :func:`~holmes_ml.serve.engine.min_analyze_last` (70, those 50 and 20): the monitor is
        run over the iterations read, and with 10 a job whose latest iterations had all slowed
        down was judged against them alone and never flagged.
    keep_iterations:
        After each verdict, delete what a job holds of iterations before its this many most
        recent ones (iteration summaries, abnormal operators, raw batches wholly before them and
        the records of numbered batches that held only those), and all but its
        :data:`~holmes_ml.serve.store.VERDICTS_KEPT` latest verdicts, so that the database
        stops growing. A resend of a pruned batch is still answered as a duplicate (by its
        ``seq``). 0: keep everything. At least ``analyze_last``.
    """

    db: Path
    host: str = "127.0.0.1"
    port: int = 8787
    token: str | None = None
    model: Path | None = None
    webhook: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_large_requests: int = 2
    analyze_interval_s: float = 2.0
    analyze_last: int = 200
    keep_iterations: int = 0

    def check(self) -> None:
        """Refuse unsafe or impossible settings (raises ``ValueError`` naming the option)."""
        if self.token is not None and not self.token.strip():
            # an empty HOLMES_SERVE_TOKEN (a variable not set where it was expanded) would
            # otherwise run the service without authentication, silently
            raise ValueError(f"--token {self.token!r} (or HOLMES_SERVE_TOKEN): expected a "
                             "non-empty token; leave both unset to run without one "
                             "(loopback only)")
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"--host {self.host!r} is not a loopback address; a --token (or "
                "HOLMES_SERVE_TOKEN) is required before the service accepts remote writes"
            )
        if not 0 < self.port < 65536:
            raise ValueError(f"--port {self.port}: expected 1..65535")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes {self.max_body_bytes}: expected at least 1024 "
                             "bytes")
        if isinstance(self.max_large_requests, bool) or not isinstance(
                self.max_large_requests, int) or self.max_large_requests < 1:
            raise ValueError(f"--large-at-once {self.max_large_requests!r}: expected a "
                             "number of requests >= 1")
        if not (math.isfinite(self.analyze_interval_s) and self.analyze_interval_s >= 0):
            raise ValueError(f"--analyze-every {self.analyze_interval_s:g}: expected seconds "
                             ">= 0 (0: only on POST /v1/jobs/JOB/analyze)")
        least = min_analyze_last()
        if isinstance(self.analyze_last, bool) or not isinstance(self.analyze_last, int) or (
                self.analyze_last != 0 and self.analyze_last < least):
            from holmes_ml.features.iterations import IrregularityConfig

            reference = IrregularityConfig().window
            raise ValueError(
                f"--analyze-last {self.analyze_last!r}: expected 0 (every iteration) or at "
                f"least {least} iterations: the irregularity monitor judges each iteration "
                f"against the {reference} regular ones before it, and the localizer looks at up "
                f"to the {least - reference} most recent; with fewer, a slowdown lasting "
                "those is judged against fewer regular iterations, or none and so never "
                "flagged")
        keep = self.keep_iterations
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0 or (
                keep and (not self.analyze_last or keep < self.analyze_last)):
            raise ValueError(
                f"--keep-iterations {keep!r}: expected 0 (keep everything) or a number of "
                f"iterations at least --analyze-last ({self.analyze_last}; with 0 there, every "
                "stored iteration is read, so nothing may be deleted)")
        if self.webhook is not None and not _is_http_url(self.webhook):
            raise ValueError(f"--webhook {self.webhook!r}: expected an http:// or https:// URL "
                             "with a host, e.g. https://alerts.example.com/holmes")

    @classmethod
    def from_env(cls, **overrides: Any) -> ServeSettings:
        """Settings from ``HOLMES_SERVE_*`` variables, overridden by non-None keyword args.

        Only the serving layer reads the environment: ``HOLMES_SERVE_DB``, ``_HOST``, ``_PORT``,
        ``_TOKEN``, ``_MODEL``, ``_WEBHOOK``.
        """
        env = os.environ
        values: dict[str, Any] = {
            "db": Path(env.get("HOLMES_SERVE_DB", "holmes-serve.db")),
            "host": env.get("HOLMES_SERVE_HOST", "127.0.0.1"),
            "port": int(env.get("HOLMES_SERVE_PORT", "8787")),
            "token": env.get("HOLMES_SERVE_TOKEN"),  # "" is refused by check(), not ignored
            "model": Path(env["HOLMES_SERVE_MODEL"]) if env.get("HOLMES_SERVE_MODEL") else None,
            "webhook": env.get("HOLMES_SERVE_WEBHOOK") or None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ----------------------------------------------------------------------------- body limits
def validation_detail(errors: Sequence[Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """A request that does not match the API's schema, as the service's other errors say it:
    one line naming the fields and what was wrong, the first field, and each error's location,
    message and type. The offending values are not echoed: a body may be megabytes, and JSON's
    out-of-range floats (``Infinity``, which Python's parser accepts) cannot be written back.

    >>> validation_detail([{"loc": ("body", "columns", "rank", 2), "msg": "Input should be a valid integer",
    ...                     "type": "int_parsing", "input": float("inf")}])[:2]
    ('body.columns.rank.2: Input should be a valid integer', 'columns.rank')
    """
    listed = [{"loc": [str(p) for p in e.get("loc", ())], "msg": _message(e),
               "type": str(e.get("type", ""))} for e in errors]
    if not listed:
        return "the request does not match the API", "body", []
    shown = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in listed[:3])
    if len(listed) > 3:
        shown += f" (and {len(listed) - 3} more)"
    # the field as the other errors name it: within the body, without list positions
    path = [p for p in listed[0]["loc"][1:] if not p.isdigit()]
    return shown, ".".join(path) or listed[0]["loc"][0], listed


def _message(error: Any) -> str:
    """An error's message; for a body that is not JSON, with the parser's reason and where.

    >>> _message({"type": "json_invalid", "loc": ("body", 7), "msg": "JSON decode error",
    ...           "ctx": {"error": "Expecting ',' delimiter"}})
    "not valid JSON: Expecting ',' delimiter at character 7"
    """
    msg = str(error.get("msg", ""))
    ctx = error.get("ctx") or {}
    if error.get("type") == "json_invalid" and ctx.get("error"):
        loc = error.get("loc", ())
        where = f" at character {loc[1]}" if len(loc) > 1 else ""
        return f"not valid JSON: {ctx['error']}{where}"
    return msg


class BodyError(HTTPException):
    """A body refused while it is parsed, before the API's schema sees it (answered as the
    service's other errors: ``detail`` and ``field``). An ``HTTPException`` so that FastAPI's
    body parsing passes it on instead of turning it into a bare 400."""

    def __init__(self, detail: str, field: str = "body", status: int = 422) -> None:
        super().__init__(status_code=status, detail=detail)
        self.field = field


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing an object that names a key twice: JSON leaves which copy
    counts to the parser (Python's keeps the last), so a client and this service could read
    different records from the same bytes.

    >>> _unique_keys([("rank", [0]), ("rank", [1])])
    Traceback (most recent call last):
    ...
    holmes_ml.serve.app.BodyError: 422: body: key 'rank' appears 2 times in one object (keys: rank); expected each key once
    """
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for twice, _ in pairs:
            if twice in seen:
                break
            seen.add(twice)
        times = sum(k == twice for k, _ in pairs)
        keys = ", ".join(list(out)[:12]) + (", ..." if len(out) > 12 else "")
        raise BodyError(f"body: key {twice!r} appears {times} times in one object "
                        f"(keys: {keys}); expected each key once")
    return out


class _UniqueKeysRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = json.loads(await self.body(), object_pairs_hook=_unique_keys)
            except UnicodeDecodeError as exc:
                raise BodyError(f"body: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                                "expected a JSON document") from exc
            except RecursionError:
                raise BodyError("body: JSON nested too deeply for the parser; expected the "
                                "API's objects (a few levels deep)") from None
        return self._json


class _UniqueKeysRoute(APIRoute):
    """Routes whose JSON bodies are parsed with :func:`_unique_keys`."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_UniqueKeysRequest(request.scope, request.receive))

        return route


def _gunzip(data: bytes, limit: int) -> tuple[bytes, str | None]:
    """A gzip body inflated, member after member (RFC 1952 allows several, and ``cat a.gz
    b.gz`` makes them), and what is wrong with it, if anything: more than ``limit`` bytes once
    inflated, a stream cut short, or bytes after it that are no gzip member."""
    out: list[bytes] = []
    total = 0
    while data:
        inflater = zlib.decompressobj(wbits=31)
        part = inflater.decompress(data, limit + 1 - total)
        total += len(part)
        if total > limit or inflater.unconsumed_tail:
            return b"", f"more than {limit} bytes once decompressed"
        if not inflater.eof:
            return b"", "the gzip stream is cut short (truncated upload?)"
        out.append(part)
        data = inflater.unused_data
        if data and data[:2] != b"\x1f\x8b":
            return b"", f"{len(data)} byte(s) after the gzip stream that are no gzip member"
    return b"".join(out), None


def _arrow_numbers(schema: Any) -> None:
    """Refuse (:class:`StoreError`, 422, naming the column, its Arrow type and the type
    expected) a column of the Arrow ``schema`` that the CommOps schema holds as a number but
    whose Arrow type is no number: text, bytes, booleans, lists, structs.

    :func:`validate` checks the frame pandas makes of the stream, and turns text into
    numbers (``"1e3"`` into rank 1000, ``" 7 "`` into 7): the JSON route refuses ``"seq":
    "1"`` (strict types), and so does this one, rather than guess. Time types pass:
    :func:`validate` reads a timestamp's or a duration's unit, and refuses one where no time
    is held.
    """
    import pyarrow as pa

    kinds = {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}
    for f in schema:
        kind = kinds.get(f.name)
        if kind not in ("int", "float"):
            continue
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                or pa.types.is_timestamp(t) or pa.types.is_duration(t)
                or pa.types.is_null(t)):
            continue  # (null: no value at all; validate says where one is missing)
        expected = ("an Arrow integer type (int64)" if kind == "int"
                    else "an Arrow floating-point or integer type (float64)")
        raise StoreError(f"body: column {f.name!r} is of Arrow type {f.type}, not a number; "
                         f"expected {expected}: text is not read as a number, as on the "
                         "JSON route", field=f"columns.{f.name}", status=422)


UNAUTHORIZED = "Authorization: expected 'Bearer <token>' with the service token"


def token_matches(authorization: bytes | str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>``."""
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, given = (authorization or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


class BodyLimit:
    """ASGI middleware: refuse bodies over ``limit`` bytes (413) and inflate gzip bodies.

    The body is read up front (the JSON parser needs it whole anyway), so an oversized upload is
    cut off at ``limit + 1`` bytes instead of being buffered. Requests whose (inflated) body
    has :data:`LARGE_BODY` bytes or more are handed on ``max_large`` at a time; the others wait.
    """

    def __init__(self, app: Any, limit: int, token: str | None = None,
                 max_large: int = 2, routes: Sequence[Any] | None = None) -> None:
        self.app = app
        self.limit = limit
        self.token = token
        self.max_large = max_large
        #: the API's routes (the list the app fills): a request none of them takes gets the
        #: app's 404 or 405, not 401 for a token it did not bring
        self.routes = routes
        self._large: asyncio.Semaphore | None = None  # made on the server's event loop

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        if self.routes is not None and not any(
                r.matches(scope)[0] == Match.FULL for r in self.routes):
            await self.app(scope, receive, send)  # 404 or 405, the body left unread
            return
        headers = dict(scope.get("headers") or [])
        if self.token and not token_matches(headers.get(b"authorization"), self.token):
            # every write of the API needs the token: asked before the body is read, inflated
            # and parsed (a small gzip body can cost gigabytes to parse)
            await self._refuse(send, 401, UNAUTHORIZED, field="authorization")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send, 413, f"request body: {int(declared)} bytes; expected at "
                               f"most {self.limit}")
            return
        chunks, size = [], 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send, 413, f"request body: more than {self.limit} bytes; "
                                   f"expected at most {self.limit}")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        encoding = headers.get(b"content-encoding", b"identity").lower()
        if encoding == b"gzip":
            try:
                body, problem = _gunzip(body, self.limit)
            except zlib.error as exc:
                await self._refuse(send, 400, f"request body: not valid gzip ({exc})")
                return
            if problem is not None:
                await self._refuse(send, 413 if problem.startswith("more") else 400,
                                   f"request body: {problem}")
                return
            # in place, not on a copy: the router notes the matched route in this scope,
            # where the latency middleware (outside this one) reads it
            scope["headers"] = [
                (k, v) for k, v in scope["headers"]
                if k not in (b"content-encoding", b"content-length")
            ] + [(b"content-length", str(len(body)).encode())]
        elif encoding != b"identity":
            await self._refuse(send, 415, f"Content-Encoding {encoding.decode(errors='replace')!r}"
                               "; expected gzip or identity")
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if len(body) < LARGE_BODY:
            await self.app(scope, replay, send)
            return
        if self._large is None:
            self._large = asyncio.Semaphore(self.max_large)
        async with self._large:
            await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Callable, status: int, detail: str, field: str = "body") -> None:
        payload = json.dumps({"detail": detail, "field": field}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


#: What each status but 200 means, as /openapi.json and /docs give it (each answers
#: :class:`~holmes_ml.serve.schemas.ErrorOut`): a client generated from the schema knows them.
_STATUSES = {
    400: "The body is no valid gzip, or is cut short (sent with Content-Encoding: gzip).",
    401: "Authorization is not 'Bearer <token>' with the service token (a service run with "
         "--token).",
    404: "Unknown job: list jobs with GET /v1/jobs.",
    409: "Conflicts with what the job holds: a batch_id sent again with other content, a seq "
         "not above the source's last (detail: 'expected more than N'), a rank another source "
         "sent, a rank on another host than earlier batches or the topology say, a "
         "communicator of other members or kind, a job column naming another job, raw "
         "records for a job of agent summaries (or the reverse); nothing of the request was "
         "kept.",
    413: "The body, or the body once inflated, is larger than the service takes "
         "(--max-body-mb).",
    415: "A Content-Encoding other than gzip or identity.",
    422: "The request does not match the API: a value of the wrong type or out of range, an "
         "unknown column or op, a bad job name or query parameter; field names it.",
    503: "The store cannot take the request now (its database locked, read-only, the disk "
         "full); nothing of the request was kept: retry later.",
}
#: What any write may be answered, its body unread or unparsed (:class:`BodyLimit`).
_WRITE = (400, 401, 413, 415, 422, 503)


def _answers(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route answering ``statuses`` (besides 200), for the OpenAPI
    schema."""
    return {status: {"model": ErrorOut, "description": _STATUSES[status]}
            for status in sorted(set(statuses))}


#: Seconds between two log lines of the same refusal (sender, method, path, status).
_REFUSAL_LOG_S = 60.0


# ----------------------------------------------------------------------------- metrics
class _JobCollector:
    """Per-job gauges computed at scrape time from the store (so they survive restarts)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self):  # noqa: ANN201 - prometheus collector protocol
        now = time.time()
        lag = GaugeMetricFamily(
            "holmes_job_lag_seconds",
            "Seconds from the start of the newest operator a job has reported, by the logs' "
            "own clock, to now by the service's clock (clocks apart count in; simulated or "
            "replayed logs, stamped in the past, show a huge lag)", labels=["job"])
        stale = GaugeMetricFamily(
            "holmes_job_verdict_age_seconds", "Seconds since the job's verdict was computed",
            labels=["job"])
        irregular = GaugeMetricFamily(
            "holmes_job_irregular_iterations", "Irregular iterations in the latest verdict",
            labels=["job"])
        top = GaugeMetricFamily(
            "holmes_job_top_candidate_score", "Score of the job's current top candidate device",
            labels=["job", "device", "kind"])
        records = GaugeMetricFamily(
            "holmes_job_records", "Operator records accepted for the job", labels=["job"])
        slowdown = GaugeMetricFamily(
            "holmes_job_slowdown", "The slowest irregular iteration's time over the usual one "
            "in the latest verdict (1 when no iteration is irregular)", labels=["job"])
        since = GaugeMetricFamily(
            "holmes_source_seconds_since_batch", "Seconds since a source (an agent) last "
            "delivered a batch of the job", labels=["job", "source"])
        behind = GaugeMetricFamily(
            "holmes_source_iterations_behind", "The job's newest iteration minus the newest a "
            "source delivered (an agent that stopped falls behind)", labels=["job", "source"])
        aside = GaugeMetricFamily(
            "holmes_source_rows_set_aside", "Rows of its logs a source (an agent) set aside as "
            "unreadable since it started, as it last reported", labels=["job", "source"])
        refused = GaugeMetricFamily(
            "holmes_source_files_refused", "Log files a source (an agent) refuses whole (a "
            "missing column, a truncated file), as it last reported", labels=["job", "source"])
        silent = GaugeMetricFamily(
            "holmes_job_silent_ranks", "Ranks the latest verdict had no data of at all (the "
            "member lists or the topology name them; an agent not running?)", labels=["job"])
        lacking = GaugeMetricFamily(
            "holmes_job_ranks_lacking_iterations", "Ranks whose data lacks some of the "
            "iterations the latest verdict analysed (an agent that stopped?)", labels=["job"])
        usual = GaugeMetricFamily(
            "holmes_job_usual_iteration_seconds", "Median time of the iterations the latest "
            "verdict read that are not irregular", labels=["job"])
        states = GaugeMetricFamily(
            "holmes_job_verdict_state", "1 for the state the job's verdict is in, 0 for the "
            "others: analysed (it has one: the holmes_job_* verdict gauges are of it), or, "
            "while it has none (and those gauges are absent), no_data, pending (not localized "
            "yet) or failed (its localization failed)", labels=["job", "state"])
        failing = GaugeMetricFamily(
            "holmes_job_analysis_failed", "1 when the job's latest localization failed (the "
            "verdict's error says why; a verdict it has is of older data), else 0",
            labels=["job"])
        for job in self.service.store.jobs():
            name = job["job"]
            latest = self.service.store.latest_verdict(name)
            error = self.service.error(name, job, latest)
            state = self.service.state(job, latest, error)
            for s in VERDICT_STATES:
                states.add_metric([name, s], float(s == state))
            failing.add_metric([name], float(error is not None))
            records.add_metric([name], float(job["records"]))
            if job["newest_ns"]:
                lag.add_metric([name], max(0.0, now - job["newest_ns"] / 1e9))
            for src in self.service.store.sources(name):
                since.add_metric([name, src["source"]], max(0.0, now - src["last_at"]))
                if src["behind_iterations"] is not None:
                    behind.add_metric([name, src["source"]], float(src["behind_iterations"]))
                aside.add_metric([name, src["source"]], float(src["rows_set_aside"]))
                refused.add_metric([name, src["source"]], float(len(src["files_refused"])))
            if latest is None:
                continue
            stale.add_metric([name], now - latest["computed_at"])
            body = latest["verdict"]
            irregular.add_metric([name], float(len(body.get("irregular_iterations", []))))
            slowdown.add_metric([name], finite(body.get("slowdown") or 1.0))
            read = body.get("input") or {}
            silent.add_metric([name], float(len(read.get("silent_ranks") or ())))
            lacking.add_metric([name], float(len(read.get("lacking_ranks") or ())))
            if read.get("usual_iteration_s"):
                usual.add_metric([name], finite(read["usual_iteration_s"]))
            if body.get("candidates"):
                c = body["candidates"][0]
                top.add_metric([name, str(c.get("device") or ""), str(c.get("kind", ""))],
                               finite(c.get("score", 0.0)))
        yield from (states, failing, lag, stale, irregular, slowdown, usual, top, records,
                    since, behind, aside, refused, silent, lacking)


# ----------------------------------------------------------------------------- webhook
#: Longest a webhook notification's POST may take in all (connecting, sending, the whole
#: answer): httpx's timeouts are per phase and per read, so a receiver answering a byte at a
#: time was waited on for as long as it kept trickling.
WEBHOOK_DEADLINE_S = 10.0
#: POSTs of one notification before it is given up (a connection error, no answer within
#: the deadline, HTTP 5xx or 429 is tried again; another answer is final).
WEBHOOK_ATTEMPTS = 3
#: Wait before the second POST; each next one waits 4 times longer (5 s, 20 s: a
#: notification is given up about a minute after its first POST at worst).
WEBHOOK_BACKOFF_S = 5.0
#: Notifications waiting their turn at most; beyond, the oldest is dropped.
WEBHOOK_QUEUE = 1000


def redact_url(url: str) -> str:
    """``url`` as the logs show it: scheme, host and port only. A webhook URL often carries
    the receiver's secret (a token as the user, the password, the path or the query), and
    the service's log is read by more people than its configuration.

    >>> redact_url("https://bot:t0ken@hooks.example.com:8443/services/T0/B1?key=x")
    'https://hooks.example.com:8443/…'
    >>> redact_url("http://[::1]/")
    'http://[::1]'
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "(webhook URL not shown)"
    if not host:
        return "(webhook URL not shown)"
    shown = f"{parts.scheme}://" + (f"[{host}]" if ":" in host else host)
    if port is not None:
        shown += f":{port}"
    hidden = parts.path not in ("", "/") or parts.query or parts.fragment
    return shown + ("/…" if hidden else "")


def _top_identity(body: dict) -> frozenset[str] | None:
    """Who a verdict blames first: its top candidate's device with the devices it is
    ``tied_with``, as a set. The order within a declared tie carries no information, so two
    verdicts naming the same tied devices in another order are the same suspect (comparing
    the first device alone paged again on each swap). ``None``: no candidate device."""
    candidates = body.get("candidates") or []
    device = candidates[0].get("device") if candidates else None
    if device is None:
        return None
    return frozenset([str(device), *(str(d) for d in candidates[0].get("tied_with") or ())])


class WebhookSender:
    """Delivers webhook notifications from a daemon thread of its own, in the order queued.

    :meth:`send` only queues: a verdict must not wait on a receiver (one POSTed from the
    analysis, under the job's lock, delayed every other job's verdict, the job's deletion and,
    through the requests waiting on that lock, ``/healthz`` and ingestion). Each POST is
    given ``deadline_s`` in all; one that fails for want of a connection or an answer, or is
    answered 5xx or 429, is tried again after ``backoff_s``, then 4 times longer, up to
    ``attempts`` POSTs. A notification given up counts once in ``failures`` (labelled with the
    last reason: ``status``, ``timeout``, ``error``); one delivered (2xx) in ``sent``; one
    dropped unsent in ``dropped`` (``queue_full``: the oldest, when ``max_queue`` wait;
    ``stopped``: queued or being sent when the service stopped).
    """

    def __init__(self, url: str, sent: Any, failures: Any, dropped: Any, *,
                 deadline_s: float = WEBHOOK_DEADLINE_S, attempts: int = WEBHOOK_ATTEMPTS,
                 backoff_s: float = WEBHOOK_BACKOFF_S, max_queue: int = WEBHOOK_QUEUE) -> None:
        self.url = url
        self.shown = redact_url(url)
        self.sent, self.failures, self.dropped = sent, failures, dropped
        self.deadline_s = deadline_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_queue = max_queue
        self._queue: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._busy = False  # a notification taken from the queue and not yet settled
        self._stopping = False
        self._cancel: Callable[[], None] | None = None  # ends the POST under way
        self._thread: threading.Thread | None = None
        self._full_said_at = -math.inf

    @property
    def pending(self) -> int:
        """Notifications queued or being delivered."""
        with self._cond:
            return len(self._queue) + self._busy

    def send(self, payload: dict[str, Any]) -> None:
        """Queue ``payload`` (``sent_at`` is added to each POST of it); never waits."""
        with self._cond:
            if self._stopping:
                self.dropped.labels("stopped").inc()
                logger.warning("webhook %s: %s not delivered: the service is stopping",
                               self.shown, _what(payload))
                return
            if len(self._queue) >= self.max_queue:
                oldest = self._queue.popleft()
                self.dropped.labels("queue_full").inc()
                now = time.monotonic()
                if now - self._full_said_at >= _REFUSAL_LOG_S:  # not once per notification
                    self._full_said_at = now
                    logger.warning("webhook %s: %d notifications waiting, the receiver does "
                                   "not keep up; dropped the oldest (%s; said once a minute, "
                                   "counted in holmes_webhook_dropped_total)", self.shown,
                                   self.max_queue, _what(oldest))
            self._queue.append(payload)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="holmes-webhook",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        """Send nothing more: end the POST under way, drop what is queued (counted and
        logged) and wait up to ``timeout`` seconds for the thread to end."""
        with self._cond:
            self._stopping = True
            left = list(self._queue)
            self._queue.clear()
            cancel = self._cancel
            self._cond.notify_all()
        if cancel is not None:
            cancel()
        if left:
            self.dropped.labels("stopped").inc(len(left))
            logger.warning("webhook %s: %d notification(s) not delivered: the service stopped "
                           "(the first: %s)", self.shown, len(left), _what(left[0]))
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: bool(self._queue) or self._stopping)
                if self._stopping:
                    return
                payload = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(payload)
            except Exception:  # noqa: BLE001 - the thread must outlive one bad notification
                logger.exception("webhook %s: delivering %s failed", self.shown,
                                 _what(payload))

    def _deliver(self, payload: dict[str, Any]) -> None:
        for attempt in range(1, self.attempts + 1):
            reason, detail, again = self._attempt(payload)
            if reason is None:
                self.sent.inc()
                return
            if reason == "stopped":
                self.dropped.labels("stopped").inc()
                logger.warning("webhook %s: %s not delivered: the service stopped during "
                               "attempt %d", self.shown, _what(payload), attempt)
                return
            if not again or attempt == self.attempts:
                self.failures.labels(reason).inc()
                logger.warning("webhook %s: %s not delivered after %d attempt(s) (%s)",
                               self.shown, _what(payload), attempt, detail)
                return
            wait = self.backoff_s * 4 ** (attempt - 1)
            logger.info("webhook %s: %s: attempt %d of %d failed (%s); trying again in %g s",
                        self.shown, _what(payload), attempt, self.attempts, detail, wait)
            with self._cond:
                if self._cond.wait_for(lambda: self._stopping, timeout=wait):
                    self.dropped.labels("stopped").inc()
                    logger.warning("webhook %s: %s not delivered: the service stopped before "
                                   "attempt %d", self.shown, _what(payload), attempt + 1)
                    return

    def _attempt(self, payload: dict[str, Any]) -> tuple[str | None, str, bool]:
        """One POST, on an event loop of its own so that the deadline covers it whole (a
        timer of the loop cancels it, wherever it waits). Returns the failure's reason
        (``None``: delivered; ``stopped``: cancelled by :meth:`stop`), what happened, and
        whether to try again."""
        import httpx

        body = {"event": payload["event"], "job": payload["job"], "sent_at": time.time(),
                **payload}
        try:
            status, text = asyncio.run(self._post(body))
        except asyncio.CancelledError:
            return "stopped", "the service stopped", False
        except (asyncio.TimeoutError, httpx.TimeoutException):
            # the receiver may have got it: a retry can reach it twice (docs/deploy.md says to
            # tell repeats by event, job and verdict_version)
            return "timeout", f"no whole answer within {self.deadline_s:g} s", True
        except Exception as exc:  # noqa: BLE001 - a dead receiver must not stop the thread
            # httpx may name the URL in its message: the secret in it stays out of the log
            why = str(exc).replace(self.url, self.shown)
            return "error", f"{type(exc).__name__}: {why}", True
        if 200 <= status < 300:
            return None, "", False
        # a redirect is not followed (the notification did not reach a receiver), and a
        # 4xx other than 429 says the request itself is refused: the same POST would be too
        return "status", f"HTTP {status}: {text}", status >= 500 or status == 429

    async def _post(self, body: dict[str, Any]) -> tuple[int, str]:
        import httpx

        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def cancel() -> None:
            if task is None:
                return
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass  # the loop closed: the POST is over anyway

        with self._cond:
            if self._stopping:
                raise asyncio.CancelledError
            self._cancel = cancel

        async def post() -> tuple[int, str]:
            async with httpx.AsyncClient(timeout=self.deadline_s) as client:
                r = await client.post(self.url, json=body)
                return r.status_code, r.text[:200]

        try:
            return await asyncio.wait_for(post(), self.deadline_s)
        finally:
            with self._cond:
                self._cancel = None


def _what(payload: dict[str, Any]) -> str:
    """A notification as the log names it."""
    return (f"{payload.get('event')} notification of job {payload.get('job')} (verdict "
            f"{payload.get('verdict_version')})")


# ----------------------------------------------------------------------------- service
#: ``error`` of a job's verdict when the service cannot localize at all.
UNAVAILABLE = "localization unavailable: holmes_ml.pipeline is not installed"


@dataclass
class Service:
    """State shared by the request handlers and the analysis thread."""

    store: Store
    analyzers: Analyzers | None
    model: Any = None
    webhook: str | None = None
    #: iterations a verdict reads (``ServeSettings.analyze_last``; None or 0: all)
    last: int | None = None
    #: iterations a job keeps after each verdict (``ServeSettings.keep_iterations``; 0: all)
    keep: int = 0
    registry: prom.CollectorRegistry = field(default_factory=prom.CollectorRegistry)
    errors: dict[str, str] = field(default_factory=dict)
    #: the data (batches, topology version) on which a job's localization last failed: the
    #: background loop does not try it again until the job changes (a bad job would otherwise
    #: cost a full localization and a traceback in the log every few seconds)
    _failed_on: dict[str, tuple[int, int]] = field(default_factory=dict)
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    #: delivers the notifications to ``webhook`` (``None``: no webhook)
    sender: WebhookSender | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.ingested = prom.Counter("holmes_ingest_records", "Operator records accepted",
                                     ["mode"], registry=r)
        self.batches = prom.Counter("holmes_ingest_batches", "Batches accepted (new ones)",
                                    ["mode"], registry=r)
        self.duplicates = prom.Counter("holmes_ingest_duplicate_batches",
                                       "Batches received again (idempotent)", registry=r)
        self.rejected = prom.Counter("holmes_requests_rejected", "Requests answered with 4xx",
                                     ["status"], registry=r)
        self.latency = prom.Histogram("holmes_request_seconds", "Request latency", ["route"],
                                      registry=r)
        self.analyses = prom.Counter("holmes_analyses", "Verdict computations", ["outcome"],
                                     registry=r)
        self.pruned = prom.Counter(
            "holmes_pruned_rows", "Rows deleted by --keep-iterations (raw_batches: raw payloads)",
            ["table"], registry=r)
        self.webhook_sent = prom.Counter(
            "holmes_webhook_sent", "Webhook notifications delivered (answered 2xx)", registry=r)
        self.webhook_failures = prom.Counter(
            "holmes_webhook_failures", "Webhook notifications given up after their attempts, "
            "once each (reason, of the last attempt: 'status' for a non-2xx answer, 'timeout' "
            "for no whole answer within the deadline (the receiver may have got it), 'error' "
            "for no connection)", ["reason"], registry=r)
        self.webhook_dropped = prom.Counter(
            "holmes_webhook_dropped", "Webhook notifications dropped unsent (reason: "
            "'queue_full' for the oldest when too many waited, 'stopped' for those queued or "
            "being sent when the service stopped)", ["reason"], registry=r)
        if self.webhook:
            self.sender = WebhookSender(self.webhook, self.webhook_sent, self.webhook_failures,
                                        self.webhook_dropped)
            sender = self.sender
            prom.Gauge("holmes_webhook_pending", "Webhook notifications queued or being "
                       "delivered", registry=r).set_function(lambda: sender.pending)
        r.register(_JobCollector(self))

    def lock(self, job: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(job, threading.Lock())

    def analyze(self, job: str, retry: bool = True) -> dict | None:
        """Recompute ``job``'s verdict if its data changed; returns the latest stored verdict.

        With ``retry`` false (the background loop) a job whose localization failed is not
        tried again until a batch or a topology comes; an explicit request always tries. A
        job no batch has come to (only its topology) gets no verdict: one of no data read
        as a healthy job (``irregular`` false, no suspect, ``holmes_job_slowdown`` 1).
        """
        with self.lock(job):
            info = self.store.job(job)
            latest = self.store.latest_verdict(job)
            if not info["batches"] or (latest is not None and not _stale(latest, info)):
                return latest
            state = (int(info["batches"]), int(info["topology_version"]))
            if not retry and self._failed_on.get(job) == state:
                return latest
            if self.analyzers is None:
                self.errors[job] = UNAVAILABLE
                return latest
            try:
                body = compute_verdict(self.store, job, self.analyzers, self.model, self.last)
            except Exception as exc:  # noqa: BLE001 - a bad job must not stop the service
                logger.exception("localization of job %s failed (not tried again until the "
                                 "job changes, or a verdict is asked for)", job)
                self.errors[job] = f"localization failed: {type(exc).__name__}: {exc}"
                self.analyses.labels("error").inc()
                self._failed_on[job] = state
                return latest
            self.errors.pop(job, None)
            self._failed_on.pop(job, None)
            self.analyses.labels("ok").inc()
            top = body["candidates"][0].get("device") if body["candidates"] else None
            version = self.store.save_verdict(job, body, info["batches"], top,
                                              info["topology_version"])
            if self.keep:
                for table, n in self.store.prune(job, self.keep).items():
                    self.pruned.labels(table).inc(n)
            # queued under the lock (it never waits: the sender's thread POSTs), so that a
            # job's notifications are queued in the order of its verdicts
            self._notify(job, latest["verdict"] if latest else None, body, version)
            return self.store.latest_verdict(job)

    def error(self, job: str, info: dict, latest: dict | None) -> str | None:
        """Why the latest localization of ``job`` (``info``: its row of :meth:`Store.jobs`;
        ``latest``: its latest verdict) failed, or will: ``None`` when it did not."""
        error = self.errors.get(job)
        if error is None and self.analyzers is None and _stale(latest, info):
            error = UNAVAILABLE  # known before the analysis thread's next pass tries
        return error

    @staticmethod
    def state(info: dict, latest: dict | None, error: str | None) -> VerdictState:
        """Whether a job has a verdict and, when not, why (:data:`VerdictState`): from its
        row of :meth:`Store.jobs`, its latest verdict and :meth:`error`."""
        if latest is not None:
            return "analysed"
        if not info["batches"]:
            return "no_data"
        return "failed" if error else "pending"

    def _notify(self, job: str, before: dict | None, body: dict, version: int) -> None:
        """Queue what verdict ``version`` (``body``) of ``job`` calls for after the verdict
        ``before`` it: ``new_top_candidate`` when it blames another device first (its tie
        aside, :func:`_top_identity`), ``resolved`` when it blames none and ``before`` did."""
        if self.sender is None:
            return
        old, new = (_top_identity(before) if before else None), _top_identity(body)
        if new == old:
            return
        payload: dict[str, Any] = {"job": job, "verdict_version": version}
        if new is None:
            payload["event"] = "resolved"
        else:
            payload.update(event="new_top_candidate", candidate=body["candidates"][0],
                           irregular_iterations=body.get("irregular_iterations", []),
                           slowdown=body.get("slowdown"))
        self.sender.send(payload)

    def close(self) -> None:
        """Stop delivering webhook notifications (those not delivered yet are dropped,
        counted and logged)."""
        if self.sender is not None:
            self.sender.stop()

    def forget(self, job: str) -> dict[str, int]:
        """Delete ``job`` and all it stored, once no verdict of it is being computed."""
        with self.lock(job):
            deleted = self.store.delete_job(job)
            self.errors.pop(job, None)
            self._failed_on.pop(job, None)
        logger.info("job %s deleted (%s)", job, ", ".join(f"{t}: {n}" for t, n in
                                                          deleted.items()))
        return deleted

    def analyze_dirty(self) -> None:
        for job in self.store.jobs():
            if job["batches"]:
                try:
                    self.analyze(job["job"], retry=False)
                except UnknownJobError:
                    pass  # deleted since the list was read
                except Exception:  # noqa: BLE001
                    logger.exception("background analysis of %s failed", job["job"])


def _no_verdict_note(job: str, state: str, error: str | None, every_s: float) -> str:
    """The ``note`` of a verdict answer of ``job`` while it has none (``state``; ``error``:
    why its localization failed), for a service localizing jobs every ``every_s`` seconds (0:
    only when asked)."""
    ask = f"POST /v1/jobs/{job}/analyze asks for it now"
    if state == "no_data":
        return ("no verdict yet: no data has come for the job (only its topology); it is "
                "localized once batches arrive")
    if state == "failed":
        if error == UNAVAILABLE:
            return "no verdict yet: this service cannot localize (error says why)"
        return ("no verdict yet: localizing the job's data failed (error says why); it is "
                f"tried again when a batch or a topology arrives, or on POST /v1/jobs/{job}/"
                "analyze")
    if every_s > 0:
        return ("no verdict yet: the job's data has not been localized yet; every "
                f"{every_s:g} s the service localizes the jobs whose data changed, and {ask}")
    return ("no verdict yet: the job's data has not been localized yet; this service "
            f"(--analyze-every 0) localizes a job only when asked: {ask}")


def _stale(latest: dict | None, info: dict) -> bool:
    """Whether the job (``info``: its row of :meth:`Store.jobs`) changed after its ``latest``
    verdict read it: batches came, or a topology was set (it names the devices). No verdict
    yet is stale once a batch came."""
    if latest is None:
        return info["batches"] > 0
    return (latest["data_batches"] < info["batches"]
            or latest["topology_version"] < info["topology_version"])


def _load_model(path: Path | None) -> Any:
    if path is None:
        return None
    if str(path) == "rule":  # the pipeline's rule baseline, as `holmes localize --model rule`
        return "rule"
    from holmes_ml.models import load_model

    return load_model(path)


def _default_analyzers() -> Analyzers | None:
    try:
        return pipeline_analyzers()
    except ImportError as exc:
        logger.warning("holmes_ml.pipeline is unavailable (%s); verdicts will not be computed",
                       exc)
        return None


def _candidate(c: dict) -> Candidate:
    return Candidate(
        kind=str(c.get("kind", "")), device=c.get("device"),
        ranks=[int(r) for r in c.get("ranks", [])], hosts=[str(h) for h in c.get("hosts", [])],
        score=finite(c.get("score", 0.0)), coords=c.get("coords"), evidence=c.get("evidence"),
        tied_with=[str(d) for d in c.get("tied_with", [])],
    )


def create_app(
    settings: ServeSettings,
    analyzers: Analyzers | None = None,
    model: Any = None,
) -> FastAPI:
    """Build the service.

    Parameters
    ----------
    settings:
        See :class:`ServeSettings` (checked with :meth:`ServeSettings.check`).
    analyzers:
        Pipeline functions; default :func:`holmes_ml.serve.engine.pipeline_analyzers`.
    model:
        An already loaded detector (overrides ``settings.model``).
    """
    settings.check()
    # The model first: a bad --model must not leave a freshly created database file behind.
    model = model if model is not None else _load_model(settings.model)
    store = Store(settings.db)
    service = Service(
        store=store,
        analyzers=analyzers if analyzers is not None else _default_analyzers(),
        model=model,
        webhook=settings.webhook,
        last=settings.analyze_last or None,
        keep=settings.keep_iterations,
    )
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(settings.analyze_interval_s):
            service.analyze_dirty()

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        thread = None
        if settings.analyze_interval_s > 0:
            thread = threading.Thread(target=loop, name="holmes-analyze", daemon=True)
            thread.start()
        yield
        stop.set()
        if thread is not None:
            thread.join(timeout=10)
        service.close()  # after the analysis: it queues notifications
        store.close()

    app = FastAPI(
        title="holmes_ml service",
        version="1",
        description="Accumulates CommOps summaries from node agents and localizes the device "
        "slowing each training job.",
        lifespan=lifespan,
    )
    app.router.route_class = _UniqueKeysRoute
    app.state.service = service
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, token=settings.token,
                       max_large=settings.max_large_requests, routes=app.router.routes)

    def require_token(authorization: str | None = Header(default=None)) -> None:
        if settings.token and not token_matches(authorization, settings.token):
            raise StoreError(UNAUTHORIZED, field="authorization", status=401)

    @app.exception_handler(StoreError)
    async def _store_error(_request: Request, exc: StoreError) -> JSONResponse:
        # counted in holmes_requests_rejected by _timing, with every other 4xx
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=exc.status)

    @app.exception_handler(sqlite3.Error)
    async def _store_unavailable(_request: Request, exc: sqlite3.Error) -> JSONResponse:
        # locked by another process, disk full, read-only: the transaction was rolled back,
        # so nothing of the request is kept; agents retry a 503 with back-off
        logger.error("store: %s", exc)
        return JSONResponse({"detail": f"store unavailable ({exc}); nothing of this request "
                             "was kept: retry later", "field": "store"}, status_code=503)

    @app.exception_handler(BodyError)
    async def _body_error(_request: Request, exc: BodyError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail, "field": exc.field},
                            status_code=exc.status_code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # an unknown route or method: the same {detail, field} as every other refusal
        field = {404: "path", 405: "method"}.get(exc.status_code, "request")
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.url.path}; expected one of the API's (see /docs)"
        elif exc.status_code == 405:
            detail = f"{request.method} not allowed on {request.url.path}"
        return JSONResponse({"detail": detail, "field": field}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail, field, errors = validation_detail(exc.errors())
        sent = request.headers.get("content-type", "")
        whole = [e for e in exc.errors() if tuple(e.get("loc", ())) == ("body",)]
        if any(e.get("type") == "missing" for e in whole):  # no body (or only whitespace)
            detail, field = "body: empty; expected a JSON object", "body"
        elif whole and not _is_json_type(sent):
            # FastAPI parses a body as JSON only when it is labelled so: `curl -d @file` sends
            # application/x-www-form-urlencoded, and valid JSON read as "not an object"
            how = f"sent as {sent!r}" if sent else "sent without a Content-Type"
            detail = (f"body: {how}, so not read as JSON; expected Content-Type: "
                      "application/json (curl: -H 'Content-Type: application/json')")
            field = "content-type"
        return JSONResponse({"detail": detail, "field": field, "errors": errors},
                            status_code=422)

    said_at: dict[tuple[str, str, str, int], float] = {}

    @app.middleware("http")
    async def _timing(request: Request, call_next: Callable) -> Response:
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        service.latency.labels(getattr(route, "path", "other")).observe(time.perf_counter() - t0)
        if 400 <= response.status_code < 500:
            service.rejected.labels(str(response.status_code)).inc()
            if request.method in ("POST", "PUT", "DELETE"):
                # a sender refused (a wrong token, a conflicting agent, a bad body) is told by
                # its answer; the operator at the service hears of it too, once a minute
                client = request.client.host if request.client else "?"
                key = (client, request.method, request.url.path, response.status_code)
                now = time.monotonic()
                if now - said_at.get(key, -_REFUSAL_LOG_S) >= _REFUSAL_LOG_S:
                    if len(said_at) > 10_000:
                        said_at.clear()
                    said_at[key] = now
                    logger.warning("refused %s %s from %s: HTTP %d (said once a minute per "
                                   "sender, path and status)", request.method,
                                   request.url.path, client, response.status_code)
        return response

    JobName = PathParam(pattern=NAME_PATTERN, max_length=128, description="Job name")

    def job_out(j: dict) -> JobOut:
        latest = store.latest_verdict(j["job"])
        top = None
        if latest and latest["verdict"].get("candidates"):
            top = _candidate(latest["verdict"]["candidates"][0])
        state = service.state(j, latest, service.error(j["job"], j, latest))
        return JobOut(job=j["job"], created_at=j["created_at"],
                      last_ingest_at=j["last_ingest_at"], records=j["records"],
                      batches=j["batches"], mode=j["mode"], verdict_state=state, top=top,
                      sources=[SourceOut(**x) for x in store.sources(j["job"])])

    # HEAD: what load balancers send (a route of its own: one route of both methods gives
    # the OpenAPI schema one operation id twice, which FastAPI warns about)
    @app.head("/healthz", response_model=None, include_in_schema=False)
    @app.get("/healthz", response_model=None, responses=_answers(503))
    def healthz() -> dict | JSONResponse:
        """Liveness and a few counters; 503 naming why when the store cannot take writes
        (its file removed, read-only, the last write failed): batches would be refused."""
        why = store.unusable()
        if why is not None:
            return JSONResponse({"status": "unavailable", "detail": f"store unusable: {why}",
                                 "field": "store"}, status_code=503)
        return {"status": "ok", "jobs": len(store.jobs()),
                "pipeline": service.analyzers is not None}

    @app.get("/metrics", response_class=Response, responses=_answers(503))
    def metrics() -> Response:
        """Prometheus metrics."""
        return Response(prom.generate_latest(service.registry),
                        media_type=prom.CONTENT_TYPE_LATEST)

    @app.get("/v1/jobs", response_model=list[JobOut], responses=_answers(503))
    def list_jobs() -> list[JobOut]:
        """All jobs with their bookkeeping and current top candidate."""
        return [job_out(j) for j in store.jobs()]

    @app.get("/v1/jobs/{job}", response_model=JobOut, responses=_answers(404, 422, 503))
    def job_detail(job: str = JobName) -> JobOut:
        """One job."""
        return job_out(store.job(job))

    @app.delete("/v1/jobs/{job}", response_model=JobDeleted,
                dependencies=[Depends(require_token)], responses=_answers(*_WRITE, 404))
    def delete_job(job: str = JobName) -> JobDeleted:
        """Delete a finished job and everything stored for it (rows per table in ``deleted``).
        A batch sent to it afterwards starts a new job of that name."""
        return JobDeleted(job=job, deleted=service.forget(job))

    @app.post("/v1/jobs/{job}/batches", response_model=Ack,
              dependencies=[Depends(require_token)], responses=_answers(*_WRITE, 409))
    async def ingest_batch(request: Request, batch: AgentBatch, job: str = JobName) -> Ack:
        """Accept one agent batch (idempotent per ``batch_id``; ``seq`` must grow)."""
        digest = hashlib.sha256(await request.body()).hexdigest()
        from starlette.concurrency import run_in_threadpool

        ack = await run_in_threadpool(store.ingest_agent, job, batch.model_dump(), digest)
        _count(ack, "agent")
        return Ack(**ack)

    @app.post("/v1/jobs/{job}/raw", response_model=Ack, dependencies=[Depends(require_token)],
              responses=_answers(*_WRITE, 409))
    async def ingest_raw(request: Request, batch: RawBatch, job: str = JobName) -> Ack:
        """Accept raw CommOps records (columnar); the service scores and localizes them."""
        digest = hashlib.sha256(await request.body()).hexdigest()
        from starlette.concurrency import run_in_threadpool

        ack = await run_in_threadpool(_store_raw, job, batch, digest)
        _count(ack, "raw")
        return Ack(**ack)

    def _store_raw(job: str, batch: RawBatch, digest: str) -> dict:
        cols = {k: v for k, v in batch.columns.__dict__.items() if v is not None}
        return _store_frame(job, batch.source, batch.batch_id, batch.seq, pd.DataFrame(cols),
                            digest)

    def _store_frame(job: str, source: str, batch_id: str, seq: int | None, df: pd.DataFrame,
                     digest: str) -> dict:
        import pyarrow as pa

        if len(df) == 0:  # stored, it made a job of no rank ("the logs hold one rank")
            raise StoreError(f"batch {batch_id!r}: no operator rows; expected at least one",
                             field="columns", status=422)
        try:
            df = validate(df, source=f"batch {batch_id!r}")
        except SchemaError as exc:
            raise StoreError(str(exc), field=f"columns.{exc.column}", status=422) from exc
        table = pa.Table.from_pandas(df, preserve_index=False)
        return store.ingest_raw(job, source, batch_id, seq, table, digest)

    @app.post(
        "/v1/jobs/{job}/raw.arrow", response_model=Ack, dependencies=[Depends(require_token)],
        responses=_answers(*_WRITE, 409),
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/vnd.apache.arrow.stream": {"schema": {"type": "string",
                                                                "format": "binary"}}}}},
    )
    async def ingest_arrow(
        request: Request,
        job: str = JobName,
        source: str = Query(..., pattern=NAME_PATTERN, max_length=128),
        batch_id: str = Query(..., pattern=NAME_PATTERN, max_length=128),
        seq: int | None = Query(None, ge=0, le=2**63 - 1),
    ) -> Ack:
        """Raw CommOps records as an Arrow IPC stream (the fast path for loggers)."""
        import pyarrow as pa
        from starlette.concurrency import run_in_threadpool

        body = await request.body()
        try:
            table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise StoreError(f"body: not an Arrow IPC stream ({exc})", field="body",
                             status=422) from exc
        _arrow_numbers(table.schema)
        try:
            # ignore_metadata: the pandas dtypes a client's table claims are not trusted (a
            # list column claimed to be text would fail the conversion itself)
            df = table.to_pandas(ignore_metadata=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise StoreError(f"body: not an Arrow IPC stream ({exc})", field="body",
                             status=422) from exc
        extra = [str(c) for c in df.columns if str(c) not in RawColumns.model_fields]
        if extra:
            # as the JSON route: a column stored unchecked could, typed otherwise by a later
            # batch, make every batch of the job unreadable together
            raise StoreError(f"body: column {extra[0]!r} is not one of the CommOps columns "
                             f"({', '.join(RawColumns.model_fields)})",
                             field=f"columns.{extra[0]}", status=422)
        digest = hashlib.sha256(body).hexdigest()
        ack = await run_in_threadpool(_store_frame, job, source, batch_id, seq, df, digest)
        _count(ack, "raw")
        return Ack(**ack)

    def _count(ack: dict, mode: str) -> None:
        if ack.get("duplicate"):
            service.duplicates.inc()
        else:
            service.batches.labels(mode).inc()
            # net records: a resent iteration with fewer operators takes some away, and a
            # counter only goes up (a negative step raised after the batch was stored: a 500)
            service.ingested.labels(mode).inc(max(int(ack["records"]), 0))

    @app.put("/v1/jobs/{job}/topology", dependencies=[Depends(require_token)],
             responses=_answers(*_WRITE, 409))
    def put_topology(body: TopologyIn, job: str = JobName) -> dict:
        """Attach the job's topology (as written by ``Topology.to_dict``)."""
        data = body.model_dump()
        try:
            Topology.from_dict(data, source="body")
            if len({len(v) for v in data["ranks"].values()}) > 1:
                raise ValueError("body.ranks: columns of unequal length")
        except (ValueError, TypeError) as exc:
            # the key a SchemaError names (groups[28].name, ranks.gpu[3]), not always "ranks"
            field = (getattr(exc, "parameter", None) or getattr(exc, "column", None)
                     or "ranks")
            raise StoreError(str(exc), field=str(field), status=422) from exc
        store.set_topology(job, data)
        return {"job": job, "ranks": len(next(iter(data["ranks"].values()), []))}

    @app.post("/v1/jobs/{job}/analyze", response_model=VerdictOut,
              dependencies=[Depends(require_token)], responses=_answers(*_WRITE, 404))
    def analyze_now(job: str = JobName) -> VerdictOut:
        """Localize now (instead of waiting for the background thread)."""
        service.analyze(job)
        return verdict(job)

    @app.get("/v1/jobs/{job}/verdict", response_model=VerdictOut,
             responses=_answers(404, 422, 503))
    def verdict(job: str = JobName) -> VerdictOut:
        """The latest verdict: irregular iterations and ranked candidates with evidence.

        A job without one yet answers 200 with ``state`` saying why (``no_data``,
        ``pending``, ``failed``, with ``error`` then), ``version`` 0 and ``irregular`` null:
        not known, which a reader must not take for healthy; ``note`` says so in words."""
        info = store.job(job)
        latest = store.latest_verdict(job)
        error = service.error(job, info, latest)
        state = service.state(info, latest, error)
        if latest is None:
            return VerdictOut(
                job=job, state=state, version=0, computed_at=0.0, data_batches=0,
                stale=_stale(latest, info), error=error, irregular=None,
                irregular_iterations=[], candidates=[],
                note=_no_verdict_note(job, state, error, settings.analyze_interval_s),
                slowdown=None, input=None)
        body = latest["verdict"]
        return VerdictOut(
            job=job,
            state=state,
            version=latest["version"],
            computed_at=latest["computed_at"],
            data_batches=latest["data_batches"],
            stale=_stale(latest, info),
            error=error,
            irregular=bool(body.get("irregular", False)),
            irregular_iterations=[int(i) for i in body.get("irregular_iterations", [])],
            candidates=[_candidate(c) for c in body.get("candidates", [])],
            workload=body.get("workload"),
            note=body.get("note"),
            slowdown=body.get("slowdown"),
            input=body.get("input"),
        )

    @app.get("/v1/jobs/{job}/candidates", response_model=list[Candidate],
             responses=_answers(404, 422, 503))
    def candidates(job: str = JobName, limit: int = Query(10, ge=1, le=1000)) -> list:
        """Ranked candidate devices of the latest verdict, best first; none while the job has
        no verdict (its verdict's ``state`` tells that from a verdict blaming no device)."""
        return verdict(job).candidates[:limit]

    @app.get("/v1/jobs/{job}/iterations", response_model=list[IterationOut],
             responses=_answers(404, 422, 503))
    def iterations(
        job: str = JobName, irregular_only: bool = False,
        last: int | None = Query(None, ge=0, le=2**31 - 1, description=(
            "The job's this many most recent iterations; 0: all of them. Default: as many as "
            "a verdict reads (holmes serve --analyze-last). Only the rows returned: each is "
            "judged against the iterations before it, over what a verdict reads (the rows "
            "of fewer are those of the default answer), or over the N asked for when more.")),
    ) -> list[IterationOut]:
        """Job-wide iteration times with the irregularity monitor's verdict on each."""
        store.job(job)
        rows = iteration_rows(store, job, service.last if last is None else last or None,
                              window=service.last)
        if irregular_only and len(rows):
            rows = rows[rows["irregular"].astype(bool)]
        return [
            IterationOut(iteration=int(r.iteration), time_us=finite(r.time_us),
                         reference_us=finite(r.reference_us), ratio=finite(r.ratio),
                         irregular=bool(r.irregular), pattern=str(r.pattern))
            for r in rows.itertuples(index=False)
        ]

    return app


def base_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 addresses in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BindError(OSError):
    """The service cannot listen on its host and port (in use, or not an address here)."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` as uvicorn binds it, or :class:`BindError` naming them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = base_url(host, port).removeprefix("http://")
        raise BindError(f"--host/--port {where}: cannot listen there ({exc.strerror or exc}); "
                        "expected a free port on an address of this machine") from exc
    sock.set_inheritable(True)
    return sock


def serve(settings: ServeSettings, analyzers: Analyzers | None = None,
          log_level: str = "warning", on_ready: Callable[[str], None] | None = None,
          on_stopped: Callable[[], None] | None = None) -> None:
    """Run the service with uvicorn until interrupted.

    The socket is bound before the database is opened: a port in use raises
    :class:`BindError` and leaves no database file behind.

    Parameters
    ----------
    on_ready:
        Called with the base URL once the service listens (not before: a port already in
        use must not be announced as listening).
    on_stopped:
        Called once the service has shut down on SIGINT or SIGTERM (before uvicorn raises the
        signal again, so that the exit status says which one stopped it).
    """
    uvicorn = require_extra("uvicorn")
    settings.check()
    sock = listen_socket(settings.host, settings.port)
    lock = None
    try:
        # two services on one database would each compute (and announce) every verdict
        lock = None if str(settings.db) == ":memory:" else hold_lock(
            str(settings.db), lambda pid: (
                f"--db {settings.db}: in use by another holmes serve (pid {pid}); expected "
                "one service per database: stop that one first, or give this one its own --db"))
        app = create_app(settings, analyzers=analyzers)
    except BaseException:
        sock.close()
        if lock is not None:
            lock.close()
        raise

    base: Any = uvicorn.Server  # a module attribute: mypy cannot see it as a class

    class _Server(base):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and on_ready is not None:
                on_ready(base_url(settings.host, settings.port))

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets=sockets)
            if on_stopped is not None:
                on_stopped()

    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                            access_log=False, timeout_graceful_shutdown=5)
    try:
        _Server(config).run(sockets=[sock])
    finally:
        sock.close()
        if lock is not None:
            lock.close()


__all__ = ["BindError", "BodyLimit", "ServeSettings", "Service", "base_url", "create_app",
           "is_loopback", "listen_socket", "serve"]
