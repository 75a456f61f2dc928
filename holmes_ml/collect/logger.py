"""Record every ``torch.distributed`` collective and P2P call of one rank as CommOps rows.

:class:`CommOpsLogger` replaces the communication functions of ``torch.distributed`` (and of
``torch.distributed.distributed_c10d``, so ``dist.P2POp(dist.isend, ...)`` keeps working) with thin
timing wrappers on ``__enter__`` and puts the originals back on ``__exit__``. Code that bound a
function *before* entering (``from torch.distributed import all_reduce``) is not seen.

Timing: on gloo (CPU) the wall clock around the blocking call; for ``async_op=True``/``isend``/
``irecv`` the returned work is wrapped and the duration ends when the caller's ``wait()`` returns.
On NCCL (``timing="cuda"`` or ``"auto"`` with a CUDA backend) CUDA events are recorded around the
call and resolved in batches off the hot path (:mod:`holmes_ml.collect.cuda_timing`).

``nbytes`` is the size of the buffer this rank *sends* (input tensor, or the sum of the input
list); 0 for barrier. P2P calls form directional pair groups ``<kind>-<src>-<dst>`` whose k-th send
and k-th recv share ``seq``, like the simulator's pipeline groups.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from holmes_ml.collect.torch_import import import_torch_distributed
from holmes_ml.collect.writer import FORMATS, Coded, RowSink

logger = logging.getLogger(__name__)

#: Wrapped function -> (canonical op, tensor parameter, how its size is read, P2P direction).
_SPECS: dict[str, tuple[str, str | None, str, str | None]] = {
    "all_reduce": ("all_reduce", "tensor", "one", None),
    "all_gather": ("all_gather", "tensor", "one", None),
    "all_gather_into_tensor": ("all_gather", "input_tensor", "one", None),
    "all_gather_single": ("all_gather", "input_tensor", "one", None),
    "reduce_scatter": ("reduce_scatter", "input_list", "list", None),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "one", None),
    "all_to_all": ("all_to_all", "input_tensor_list", "list", None),
    "all_to_all_single": ("all_to_all", "input", "one", None),
    "broadcast": ("broadcast", "tensor", "one", None),
    "reduce": ("reduce", "tensor", "one", None),
    "barrier": ("barrier", None, "none", None),
    "send": ("send", "tensor", "one", "send"),
    "recv": ("recv", "tensor", "one", "recv"),
    "isend": ("send", "tensor", "one", "send"),
    "irecv": ("recv", "tensor", "one", "recv"),
}
#: Canonical op names; buffered rows hold an index into this tuple instead of the string.
_OP_NAMES: tuple[str, ...] = tuple(dict.fromkeys(spec[0] for spec in _SPECS.values()))
_OP_CODE = {name: i for i, name in enumerate(_OP_NAMES)}
_TIMINGS = ("auto", "wall", "cuda")
# Row layout kept in the buffer, expanded to the file schema at flush time: start and end are
# raw time.perf_counter_ns() readings (end None while an async op or CUDA event is pending).
_IT, _OP, _GIDX, _SEQ, _NBYTES, _START, _END, _PEER = range(8)


def rank_log_path(out_dir: str | Path, rank: int, fmt: str = "parquet") -> Path:
    """Where rank ``rank`` writes its log: ``<out_dir>/commops-rank00003.parquet``."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not a known log format; expected one of {list(FORMATS)}")
    return Path(out_dir) / f"commops-rank{int(rank):05d}{FORMATS[fmt]}"


@dataclass(frozen=True)
class LoggerConfig:
    """Settings of :class:`CommOpsLogger`.

    Parameters
    ----------
    out_dir:
        Directory of the per-rank files (see :func:`rank_log_path`).
    fmt:
        ``"parquet"`` or ``"jsonl"``.
    flush_every:
        Completed rows buffered before they are appended to the file.
    group_names, group_kinds:
        Optional names and kinds (``tp``, ``dp``, ``pp`` ...) of process groups, keyed by the
        sorted tuple of their global ranks. Unnamed groups are called ``<kind>-<hash>`` (or
        ``pg-<hash>``), the same on every rank; the default group is ``world``.
    p2p_kind:
        ``group_kind`` and name prefix of point-to-point pair groups.
    timing:
        ``"wall"``, ``"cuda"`` (CUDA events) or ``"auto"`` (CUDA when the group's backend is NCCL).
    host, job:
        Written in the ``host``/``job`` columns (host defaults to the machine name).
    start_iteration:
        Iteration number before the first :meth:`CommOpsLogger.step`.
    """

    out_dir: str | Path = "commops-logs"
    fmt: str = "parquet"
    flush_every: int = 8192
    group_names: Mapping[tuple[int, ...], str] = field(default_factory=dict, hash=False)
    group_kinds: Mapping[tuple[int, ...], str] = field(default_factory=dict, hash=False)
    p2p_kind: str = "pp"
    timing: str = "auto"
    host: str | None = None
    job: str = ""
    start_iteration: int = 0

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt={self.fmt!r}: expected one of {list(FORMATS)}")
        if self.timing not in _TIMINGS:
            raise ValueError(f"timing={self.timing!r}: expected one of {list(_TIMINGS)}")
        if int(self.flush_every) < 1:
            raise ValueError(f"flush_every={self.flush_every!r}: expected an integer >= 1")


class _TimedWork:
    """Proxy of an async ``Work``: ``wait()`` closes the duration of its logged row."""

    __slots__ = ("_work", "_row", "_owner")

    def __init__(self, work: Any, row: list[Any], owner: CommOpsLogger) -> None:
        self._work = work
        self._row = row
        self._owner = owner

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs)
        if self._row[_END] is None:
            self._row[_END] = time.perf_counter_ns()
            self._owner._pending -= 1
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class CommOpsLogger:
    """Context manager recording this rank's ``torch.distributed`` calls.

    Parameters
    ----------
    config:
        A :class:`LoggerConfig` (defaults apply when omitted).

    Examples
    --------
    >>> with CommOpsLogger(LoggerConfig(out_dir="logs")) as log:  # doctest: +SKIP
    ...     for batch in data:
    ...         train_step(batch)
    ...         log.step()
    """

    def __init__(self, config: LoggerConfig | None = None) -> None:
        self.config = config or LoggerConfig()
        self.iteration = int(self.config.start_iteration)
        self.rank = -1
        self.path: Path | None = None
        self._rows: list[Any] = []  # tuples (sync wall) or lists (async, CUDA)
        self._pending = 0
        self._groups: list[tuple[str, str, str]] = []  # (name, group_ranks, kind)
        self._gidx: dict[int, tuple[Any, int]] = {}  # id(pg) -> (pg kept alive, index)
        self._gfast: dict[Any, int] = {}  # group handle -> index (identity-hashed handles)
        self._p2p: dict[tuple[int, int], int] = {}  # (src, dst) -> group index
        self._seq: list[int] = []
        self._saved: list[tuple[Any, str, Any]] = []
        self._busy = [False]  # shared by all wrappers: one cell, no attribute store
        self._cuda: Any = None
        self._sink: RowSink | None = None
        self._dist: Any = None
        self._wall_offset = 0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> CommOpsLogger:
        dist = import_torch_distributed()
        if not dist.is_initialized():
            raise RuntimeError(
                "CommOpsLogger: torch.distributed is not initialized; call "
                "dist.init_process_group(...) before entering the logger"
            )
        if self._saved:
            raise RuntimeError("CommOpsLogger is already active; it cannot be entered twice")
        self._dist = dist
        self.rank = int(dist.get_rank())
        self.path = rank_log_path(self.config.out_dir, self.rank, self.config.fmt)
        self._sink = RowSink(self.path, self.config.fmt)
        self._host = self.config.host or socket.gethostname()
        timing = self.config.timing
        if timing == "auto":
            timing = "cuda" if "nccl" in str(dist.get_backend()).lower() else "wall"
        if timing == "cuda":
            import torch

            from holmes_ml.collect.cuda_timing import CudaEventTimer

            self._cuda = CudaEventTimer(torch)
        self._wall_offset = time.time_ns() - time.perf_counter_ns()
        c10d = dist.distributed_c10d
        for name, spec in _SPECS.items():
            orig = getattr(c10d, name, None)
            if orig is None:
                continue
            wrapper = self._make_wrapper(orig, *spec)
            for module in (dist, c10d):
                if getattr(module, name, None) is orig:
                    self._saved.append((module, name, orig))
                    setattr(module, name, wrapper)
        logger.debug("rank %d: logging %d functions to %s", self.rank, len(self._saved), self.path)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Restore the original functions, flush every row and finish the file."""
        for module, name, orig in reversed(self._saved):
            setattr(module, name, orig)
        self._saved.clear()
        if self._sink is None:
            return
        if self._pending:
            logger.warning(
                "rank %d: %d async operations were never waited on; their duration is unknown "
                "and they are dropped", self.rank, self._pending,
            )
        self.flush(final=True)
        self._sink.close()
        self._sink = None

    def step(self) -> None:
        """Mark the end of an iteration: later calls belong to the next one."""
        self.iteration += 1
        if self._cuda is not None:
            self._cuda.resolve(_START, _END)

    # ------------------------------------------------------------------ groups
    def _group_index(self, group: Any) -> int:
        index = self._resolve_group(group)
        try:
            self._gfast[group] = index
        except TypeError:  # unhashable handle: the id-keyed table below still finds it
            pass
        return index

    def _resolve_group(self, group: Any) -> int:
        entry = self._gidx.get(id(group))
        if entry is not None and entry[0] is group:
            return entry[1]
        dist = self._dist
        pg = group if group is not None else dist.group.WORLD
        known = self._gidx.get(id(pg))
        if known is not None and known[0] is pg:  # None and WORLD are the same group
            self._gidx[id(group)] = (group, known[1])
            return known[1]
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
        key = tuple(sorted(ranks))
        kind = self.config.group_kinds.get(key, "")
        name: str
        if group is None or pg is dist.group.WORLD:
            name = "world"  # the default group, even when a mapping names the same ranks
        elif key in self.config.group_names:
            name = self.config.group_names[key]
        else:
            digest = hashlib.sha1(" ".join(map(str, key)).encode()).hexdigest()[:8]
            name = f"{kind or 'pg'}-{digest}"
        taken = {g[0] for g in self._groups}
        if name in taken:  # another process group with the same ranks: keep seq apart
            base, k = name, 1
            while f"{base}#{k}" in taken:
                k += 1
            name = f"{base}#{k}"
        index = self._add_group(name, " ".join(map(str, ranks)), kind)
        self._gidx[id(group)] = (group, index)
        self._gidx[id(pg)] = (pg, index)
        return index

    def _add_group(self, name: str, ranks: str, kind: str) -> int:
        self._groups.append((name, ranks, kind))
        self._seq.append(0)
        return len(self._groups) - 1

    def _pair_index(self, src: int, dst: int) -> int:
        index = self._p2p.get((src, dst))
        if index is None:
            kind = self.config.p2p_kind
            index = self._add_group(f"{kind}-{src}-{dst}", f"{src} {dst}", kind)
            self._p2p[(src, dst)] = index
        return index

    # ------------------------------------------------------------------ hot path
    def _make_wrapper(
        self, orig: Any, op: str, tensor_param: str | None, size: str, p2p: str | None
    ) -> Any:
        # Everything that can be decided once per wrapped function is decided here, so the
        # per-call work is: argument lookup, one cached group lookup, two clock reads, one
        # tuple append. Formatting (wall-clock start, microseconds, group names) waits for flush.
        params = list(inspect.signature(orig).parameters)
        gpos = params.index("group") if "group" in params else 10**6
        apos = params.index("async_op") if "async_op" in params else 10**6
        tpos = params.index(tensor_param) if tensor_param else -1
        tname = tensor_param or ""
        one = size == "one"
        peer_name = {"send": "dst", "recv": "src"}.get(p2p or "", "")
        ppos = params.index(peer_name) if peer_name else -1
        always_async = orig.__name__ in ("isend", "irecv")
        opc = _OP_CODE[op]
        perf = time.perf_counter_ns
        gcache = self._gfast
        cuda = self._cuda is not None
        seqs = self._seq
        busy = self._busy
        flush_every = int(self.config.flush_every)
        this = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if busy[0]:  # a wrapped function calling another: log the outer one only
                return orig(*args, **kwargs)
            busy[0] = True
            try:
                n = len(args)
                if kwargs:
                    group = args[gpos] if n > gpos else kwargs.get("group")
                    asyn = always_async or (
                        args[apos] if n > apos else kwargs.get("async_op", False)
                    )
                else:
                    group = args[gpos] if n > gpos else None
                    asyn = always_async or (args[apos] if n > apos else False)
                if tpos < 0:
                    nbytes = 0
                else:
                    t = args[tpos] if n > tpos else kwargs[tname]
                    nbytes = t.nbytes if one else sum(x.nbytes for x in t)
                if p2p is None:
                    try:
                        gidx = gcache[group]
                    except (KeyError, TypeError):  # first use, or an unhashable group handle
                        gidx = this._group_index(group)
                else:
                    gidx = -1  # known once the peer is (recv from any source returns it)
                if asyn or cuda:
                    return this._call_slow(orig, args, kwargs, opc, gidx, nbytes, asyn, p2p,
                                           (ppos, peer_name, group))
                t0 = perf()
                out = orig(*args, **kwargs)
                t1 = perf()
                if p2p is None:
                    peer = -1
                else:
                    peer, gidx = this._p2p_target(args, kwargs, ppos, peer_name, p2p, group, out)
                seq = seqs[gidx]
                seqs[gidx] = seq + 1
                rows = this._rows
                # a tuple of ints: the garbage collector untracks it at its first collection, so
                # a long buffer does not slow every later collection (lists would stay tracked)
                rows.append((this.iteration, opc, gidx, seq, nbytes, t0, t1, peer))
                if len(rows) >= flush_every:
                    this.flush()
                return out
            finally:
                busy[0] = False

        wrapper.__name__ = orig.__name__
        wrapper.__doc__ = orig.__doc__
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        return wrapper

    def _p2p_target(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], ppos: int, peer_name: str,
        p2p: str, group: Any, out: Any,
    ) -> tuple[int, int]:
        """Global peer rank and pair-group index of a send/recv call (after it returned)."""
        peer = args[ppos] if len(args) > ppos else kwargs.get(peer_name)
        if peer is None:
            gp = kwargs.get("group_dst" if p2p == "send" else "group_src")
            if gp is not None:
                peer = self._dist.get_global_rank(group or self._dist.group.WORLD, gp)
            elif p2p == "recv" and isinstance(out, int):
                peer = out  # recv from any source returns the sender
            else:
                peer = -1
        peer = int(peer)
        src, dst = (self.rank, peer) if p2p == "send" else (peer, self.rank)
        return peer, self._pair_index(src, dst)

    def _call_slow(
        self, orig: Any, args: tuple[Any, ...], kwargs: dict[str, Any], opc: int, gidx: int,
        nbytes: int, asyn: bool, p2p: str | None, peer_args: tuple[int, str, Any],
    ) -> Any:
        """Async calls and CUDA timing: the row is a list whose end is filled in later."""
        row: list[Any] = [self.iteration, opc, gidx, 0, nbytes, 0, None, -1]
        cuda = self._cuda
        ev = cuda.start() if cuda is not None else None
        t0 = time.perf_counter_ns()
        row[_START] = t0
        out = orig(*args, **kwargs)
        if not asyn:
            if cuda is not None:
                cuda.stop(row, ev, _START, _END)
            else:
                row[_END] = time.perf_counter_ns()
        if p2p is not None:
            ppos, peer_name, group = peer_args
            row[_PEER], gidx = self._p2p_target(args, kwargs, ppos, peer_name, p2p, group, out)
            row[_GIDX] = gidx
        row[_SEQ] = self._seq[gidx]
        self._seq[gidx] += 1
        self._rows.append(row)
        if asyn and out is not None:
            self._pending += 1
            out = _TimedWork(out, row, self)
        if len(self._rows) >= self.config.flush_every:
            self.flush()
        return out

    # ------------------------------------------------------------------ output
    def flush(self, final: bool = False) -> int:
        """Append completed rows to the file; rows still waiting for a duration stay buffered.

        Returns
        -------
        int
            Rows written.
        """
        if self._sink is None:
            return 0
        if self._cuda is not None:
            self._cuda.resolve(_START, _END)
        rows = self._rows
        if self._pending or self._cuda is not None:
            done = [r for r in rows if r[_END] is not None]
            self._rows = [] if final else [r for r in rows if r[_END] is None]
        else:  # the common case: every buffered row is complete
            done, self._rows = rows, []
        if not done:
            return 0
        n = len(done)
        it, op, gidx, seq, nbytes, start, end, peer = zip(*done, strict=True)
        start_a = np.fromiter(start, dtype=np.int64, count=n)
        gidx_a = np.fromiter(gidx, dtype=np.int64, count=n)
        names, ranks, kinds = zip(*self._groups, strict=True)
        one = np.zeros(n, dtype=np.int64)
        columns = {
            "iteration": np.fromiter(it, dtype=np.int64, count=n),
            "rank": np.full(n, self.rank, dtype=np.int64),
            "op": Coded(np.fromiter(op, dtype=np.int64, count=n), _OP_NAMES),
            "group": Coded(gidx_a, names),
            "seq": np.fromiter(seq, dtype=np.int64, count=n),
            "nbytes": np.fromiter(nbytes, dtype=np.int64, count=n),
            "start_ns": start_a + self._wall_offset,
            "duration_us": (np.fromiter(end, dtype=np.int64, count=n) - start_a) / 1000.0,
            "group_ranks": Coded(gidx_a, ranks),
            "group_kind": Coded(gidx_a, kinds),
            "peer": np.fromiter(peer, dtype=np.int64, count=n),
            "host": Coded(one, (self._host,)),
            "job": Coded(one, (self.config.job,)),
        }
        self._sink.write(columns)
        return n
