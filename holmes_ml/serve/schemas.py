"""Wire format between agents, loggers and the central service (pydantic models).

Tables travel *columnar* (one JSON list per column) because it is several times smaller and
faster to validate than a list of objects; every table checks that its columns have equal
lengths and names the offending column when they do not. Pydantic turns every other mistake
(wrong type, negative size, unknown operator) into a 422 whose ``loc`` names the field.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np

from holmes_ml.serve import NAME_PATTERN, require_extra

require_extra("pydantic")

from pydantic import (  # noqa: E402
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from holmes_ml.io.schema import OP_TYPES  # noqa: E402

I64_MAX = 2**63 - 1

Name = Annotated[str, Field(pattern=NAME_PATTERN, min_length=1, max_length=128)]
NonNegInt = Annotated[int, Field(ge=0, le=I64_MAX)]
#: Operators one rank ran in one iteration: a billion is far beyond any job, and the job's
#: record count, summed over every batch, stays a 64-bit integer.
OpCount = Annotated[int, Field(ge=0, le=2**31 - 1)]
Rank = Annotated[int, Field(ge=0, le=2**31 - 1)]
Peer = Annotated[int, Field(ge=-1, le=2**31 - 1)]
#: Microseconds; at most 2**63 ns (292 years): a time of 1e308 would overflow the service's
#: nanosecond arithmetic, not be refused.
Duration = Annotated[float, Field(ge=0.0, le=9.2e15, allow_inf_nan=False)]
Score = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=256)]


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("expected a printable name (no control characters: they would reach "
                         "terminals and metric labels as they are)")
    return value


#: A host name: it is printed by `holmes jobs` and is a label of /metrics.
HostName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_printable)]
#: A host column of operator records ("": not known).
HostOrNone = Annotated[str, Field(max_length=256), AfterValidator(_printable)]
Coord = Annotated[int, Field(ge=-1, le=2**31 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-1e15, le=1e15)]
OpName = Literal[OP_TYPES]  # type: ignore[valid-type]


class _Strict(BaseModel):
    # Unknown fields are a client bug (a typo would silently drop data): reject them by name.
    # Strict types: a number must be a JSON number (``"1024"``, ``true`` or ``1.5`` is not an
    # integer) so a client that writes the wrong type hears of it instead of having it guessed.
    model_config = ConfigDict(extra="forbid", strict=True)


def _first_repeat(values: list, what: str, expected: str) -> None:
    """ValueError naming the first value of ``values`` that repeats an earlier one."""
    seen: dict = {}
    for i, v in enumerate(values):
        if v in seen:
            raise ValueError(f"row {i}: {what} {v!r} again (as in row {seen[v]}); expected "
                             f"{expected}")
        seen[v] = i


class _Columnar(_Strict):
    """A table sent as equal-length columns."""

    @model_validator(mode="after")
    def _equal_lengths(self):  # noqa: ANN202 - pydantic hook
        lengths = {
            name: len(value)
            for name, value in self.__dict__.items()
            if isinstance(value, list) and value is not None
        }
        if lengths:
            first, n = next(iter(lengths.items()))
            for name, length in lengths.items():
                if length != n:
                    raise ValueError(
                        f"column {name!r} has {length} values but column {first!r} has {n}; "
                        "expected columns of equal length"
                    )
        return self

    def __len__(self) -> int:
        for value in self.__dict__.values():
            if isinstance(value, list):
                return len(value)
        return 0


class RankTable(_Columnar):
    """Where the agent's ranks run (sent once; lets the centre name GPUs, NICs and hosts)."""

    rank: list[Rank]
    host: list[HostName]
    gpu: list[Annotated[int, Field(ge=0, le=1023)]]
    dp: list[Coord] | None = None
    pp: list[Coord] | None = None
    tp: list[Coord] | None = None
    cp: list[Coord] | None = None
    ep: list[Coord] | None = None

    @model_validator(mode="after")
    def _one_place_per_rank(self):  # noqa: ANN202 - pydantic hook
        # a rank listed twice would leave the one stored to the order of the rows, two ranks
        # on one GPU would be blamed as one device
        _first_repeat(self.rank, "rank", "each rank once")
        _first_repeat(list(zip(self.host, self.gpu, strict=True)), "(host, gpu)",
                      "one rank per GPU of a host")
        return self


class GroupInfo(_Strict):
    """One communicator: its members in group order (sent once per group)."""

    name: Text = Field(min_length=1)
    kind: Text = "other"
    ranks: list[Rank] = Field(min_length=1, max_length=1_000_000)

    @model_validator(mode="after")
    def _members_once(self):  # noqa: ANN202 - pydantic hook
        _first_repeat(self.ranks, "rank", "each member once")
        return self


class IterationTable(_Columnar):
    """Per (iteration, rank) summary: the window the rank spent in the iteration's operators.

    Mirrors ``NodeSummary.iterations`` of :mod:`holmes_ml.pipeline`: ``start_ns`` is the rank's
    earliest arrival at an operator of the iteration, ``end_ns`` the latest completion,
    ``comm_us`` the summed operator time and ``n_ops`` how many operators were scored (the ones
    not reported abnormal are thereby known to be normal). ``compute_us``, optional: the rank's
    compute time in the iteration, when its logs carry it (``step_compute_us``; ``null`` for a
    rank whose logs do not); it lets the centre tell a heavier pipeline stage from a slow device.
    """

    iteration: list[NonNegInt]
    rank: list[Rank]
    start_ns: list[NonNegInt]
    end_ns: list[NonNegInt]
    comm_us: list[Duration]
    n_ops: list[OpCount]
    compute_us: list[Duration | None] | None = None

    @model_validator(mode="after")
    def _ends_after_starts(self):  # noqa: ANN202 - pydantic hook
        start, end = np.asarray(self.start_ns, np.int64), np.asarray(self.end_ns, np.int64)
        bad = np.flatnonzero(end < start) if len(start) == len(end) else ()
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"row {i}: end_ns {end[i]} before start_ns {start[i]}; expected "
                             "the rank's latest completion at or after its earliest arrival")
        return self


class _CanonicalColumns(_Columnar):
    """The required CommOps columns (:data:`holmes_ml.io.schema.REQUIRED_COLUMNS`)."""

    iteration: list[NonNegInt]
    rank: list[Rank]
    op: list[OpName]
    group: list[Text]
    seq: list[NonNegInt]
    nbytes: list[NonNegInt]
    start_ns: list[NonNegInt]
    duration_us: list[Duration]

    @model_validator(mode="after")
    def _ends_fit(self):  # noqa: ANN202 - pydantic hook
        start = np.asarray(self.start_ns, np.float64)
        dur = np.asarray(self.duration_us, np.float64)
        bad = np.flatnonzero(start + dur * 1e3 >= 2.0**63) if len(start) == len(dur) else ()
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"row {i}: start_ns {self.start_ns[i]} + duration_us "
                             f"{self.duration_us[i]} ends beyond 2**63 ns; expected an op "
                             "ending within 64-bit ns")
        return self


class AbnormalOpTable(_CanonicalColumns):
    """Operators the agent's detector flagged, canonical columns plus ``score``."""

    score: list[Score]
    peer: list[Peer] | None = None
    host: list[HostOrNone] | None = None
    group_kind: list[Text] | None = None
    excess_us: list[Finite] | None = None


class SetAsideFile(_Strict):
    """One log file of an agent that it could not read all of: ``rows`` of it set aside (the
    rest shipped), or (``rows`` 0) the whole file refused until it changes; ``why``: the
    latest reason, naming the line."""

    file: Text = Field(min_length=1)
    rows: NonNegInt = 0
    why: Text = ""


class SetAside(_Strict):
    """What an agent could not read of its logs, as it stands when the batch is made: rows
    set aside since the agent started (``rows``; by file in ``files``) and the files it refuses
    whole now (``refused``). A newer batch's report replaces the older one."""

    rows: NonNegInt = 0
    files: list[SetAsideFile] = Field(default_factory=list, max_length=100)
    refused: list[SetAsideFile] = Field(default_factory=list, max_length=100)


class AgentBatch(_Strict):
    """What an agent sends: one outbox entry.

    ``(source, seq)`` orders an agent's batches (``seq`` must grow from batch to batch);
    ``batch_id`` makes a resend idempotent: the same id with the same content gets the same
    answer and stores nothing twice.
    """

    source: Name
    batch_id: Name
    seq: NonNegInt
    ranks: RankTable | None = None
    groups: list[GroupInfo] = Field(default_factory=list, max_length=1_000_000)
    iterations: IterationTable | None = None
    abnormal: AbnormalOpTable | None = None
    set_aside: SetAside | None = None

    @model_validator(mode="after")
    def _not_empty(self):  # noqa: ANN202 - pydantic hook
        # an empty batch made a job of no rank (listed, with metrics and a verdict)
        if not (self.groups or any(t is not None and len(t)
                                   for t in (self.ranks, self.iterations, self.abnormal))):
            raise ValueError("an empty batch; expected at least one of iterations, abnormal, "
                             "ranks or groups")
        return self


class RawColumns(_CanonicalColumns):
    """Raw CommOps records (the canonical schema of :mod:`holmes_ml.io.schema`)."""

    group_ranks: list[Annotated[str, Field(max_length=1_000_000)]] | None = None
    peer: list[Peer] | None = None
    host: list[HostOrNone] | None = None
    group_kind: list[Text] | None = None
    step_compute_us: list[Duration] | None = None
    #: the job the records say they are of: one naming another job is refused (409)
    job: list[Text] | None = None


class RawBatch(_Strict):
    """Raw records posted by a logger or a small job (the centre scores and localizes them)."""

    source: Name
    batch_id: Name
    seq: NonNegInt | None = Field(
        default=None, description="Optional; when given, must grow from batch to batch."
    )
    columns: RawColumns


class TopologyIn(_Strict):
    """A topology as written by :meth:`holmes_ml.topology.Topology.to_dict`."""

    model_config = ConfigDict(extra="allow")
    ranks: dict[str, list[int | str]]
    groups: list[GroupInfo] = Field(default_factory=list)
    spines: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    gpus_per_host: Annotated[int, Field(ge=1, le=1024)] = 8
    parallel: dict[str, Annotated[int, Field(ge=1, le=2**31 - 1)]] = Field(default_factory=dict)


# ----------------------------------------------------------------------------- responses
class Ack(BaseModel):
    """Answer to an accepted write; a duplicate gets the stored answer with ``duplicate``."""

    job: str
    source: str
    batch_id: str
    seq: int | None
    records: int
    duplicate: bool = False
    #: (agent batches) ranks of the batch whose host the job does not know, communicators of
    #: its abnormal operators whose members it does not know: the agent sends them again
    unknown_ranks: list[int] = []
    unknown_groups: list[str] = []


class ErrorOut(BaseModel):
    """Every refusal of the service (4xx, and 503 from the store): what is wrong, naming the
    value and what was expected, and the request field it is about (``body``,
    ``columns.rank``, ``authorization``, ``seq``, ``store``...)."""

    detail: str
    field: str
    #: (422 for a request not matching the API's schema) each error's location, message, type
    errors: list[dict[str, Any]] | None = None


class JobDeleted(BaseModel):
    """Answer to ``DELETE /v1/jobs/{job}``: the rows deleted per table."""

    job: str
    deleted: dict[str, int]


class Candidate(BaseModel):
    kind: str
    device: str | None = None
    ranks: list[int]
    hosts: list[str]
    score: float
    coords: dict | list | None = None
    evidence: dict | list | str | None = None
    tied_with: list[str] = Field(default_factory=list,
                                 description="Devices the logs cannot tell apart from this one")


#: Whether a job has a verdict and, when it has none, why (``VerdictOut.state``,
#: ``JobOut.verdict_state``): ``analysed``, it has one; ``no_data``, no batch has come (only its
#: topology); ``pending``, its data waits for the service to localize it; ``failed``, localizing
#: its data failed (``error`` says why) and no earlier verdict exists.
VerdictState = Literal["no_data", "pending", "failed", "analysed"]

VERDICT_STATE_DOC = (
    "Whether the job has a verdict: 'analysed' (the fields below are its latest verdict) or, "
    "while it has none, why: 'no_data' (no batch has come yet, only its topology), 'pending' "
    "(its data has not been localized yet) or 'failed' (localizing its data failed: error "
    "says why). A job without a verdict is not known to be healthy: irregular is null.")


class VerdictOut(BaseModel):
    """A job's latest verdict, or (``state`` other than ``analysed``) the answer that it has
    none yet: then ``version`` 0, ``irregular`` null (not known, not false), no irregular
    iteration nor candidate, and ``note`` saying why in words."""

    job: str
    state: VerdictState = Field(description=VERDICT_STATE_DOC)
    version: int = Field(description="The verdict's number (1, 2, ...); 0 while the job has "
                         "none (state other than 'analysed')")
    computed_at: float = Field(description="Unix seconds when the verdict was computed; 0 "
                               "while the job has none")
    data_batches: int = Field(description="Batches the verdict was computed from (0 while "
                              "the job has none)")
    stale: bool = Field(description="True when batches arrived or a topology was set after "
                        "this verdict (and, while the job has none, once a batch came)")
    error: str | None = Field(None, description="Why the job's latest localization failed; "
                              "null when it did not. With state 'failed' the job has no "
                              "verdict; with 'analysed' the verdict is of older data (stale)")
    irregular: bool | None = Field(description="Whether the verdict found irregular "
                                   "iterations; null while the job has no verdict (state "
                                   "other than 'analysed'): not known, which is not healthy")
    irregular_iterations: list[int] = Field(description="Empty while the job has no verdict")
    candidates: list[Candidate] = Field(description="Suspects, best first; empty when the "
                                        "verdict blames no device, and while the job has no "
                                        "verdict (see state)")
    workload: dict | list | None = None
    note: str | None = Field(None, description="A caveat the reader needs (as from holmes "
                             "localize), e.g. that no iteration was irregular")
    slowdown: float | None = Field(None, description="The slowest irregular iteration's time "
                                   "over the usual one; null when none is irregular")
    input: dict[str, int | float | list[int]] | None = Field(
        None, description="ops, ranks and iterations read; usual_iteration_s: the median "
        "time in seconds of those iterations not irregular; analysed: the first and last "
        "iteration of the window the candidates come from")


class SourceOut(BaseModel):
    """One sender of a job's batches (an agent's ``--source``, by default its host name)."""

    source: str
    first_at: float
    last_at: float
    batches: int
    records: int
    last_iteration: int | None
    #: the job's newest iteration minus this source's newest
    behind_iterations: int | None
    #: silent for 120 s while the job's other sources went on, and behind them
    lagging: bool
    #: rows of its logs the agent set aside as unreadable (its latest report; 0: none)
    rows_set_aside: int = 0
    #: by file: {file, rows, why}
    files_set_aside: list[dict] = []
    #: files the agent refuses whole (a missing column, a truncated file): {file, why}
    files_refused: list[dict] = []


class JobOut(BaseModel):
    job: str
    created_at: float
    last_ingest_at: float | None
    records: int
    batches: int
    mode: Literal["agent", "raw", "empty"]
    verdict_state: VerdictState = Field(description="As the job's verdict's state: "
                                        + VERDICT_STATE_DOC)
    top: Candidate | None = Field(None, description="The latest verdict's first suspect; null "
                                  "when it blames none, and while the job has no verdict "
                                  "(see verdict_state)")
    sources: list[SourceOut] = []


class IterationOut(BaseModel):
    iteration: int
    time_us: float
    reference_us: float
    ratio: float
    irregular: bool
    pattern: str


def finite(x: float) -> float:
    """Replace NaN/inf by 0 so responses stay valid JSON."""
    return float(x) if math.isfinite(float(x)) else 0.0
