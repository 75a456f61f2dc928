"""Record every ``torch.distributed`` collective and P2P call of one rank as CommOps rows.

:class:`CommOpsLogger` replaces the communication functions of ``torch.distributed`` (and of
``torch.distributed.distributed_c10d``, so ``dist.P2POp(dist.isend, ...)`` keeps working) with thin
timing wrappers on ``__enter__`` and puts the originals back on ``__exit__``. Code that bound a
function *before* entering (``from torch.distributed import all_reduce``) is not seen.

Timing: on gloo (CPU) the wall clock around the blocking call; for ``async_op=True``/``isend``/
``irecv`` the returned work is wrapped and the duration ends when the caller's ``wait()`` returns.
On NCCL (``timing="cuda"`` or ``"auto"`` with a CUDA backend) CUDA events are recorded around the
call and resolved in batches off the hot path (:mod:`holmes_ml.collect.cuda_timing`).

Hot path: a blocking wall-clock call packs one row of 6 int64 into a preallocated bytearray
(no Python object survives the call, so the logger never wakes the garbage collector) through a
wrapper generated with the wrapped function's own parameter list; async calls and CUDA timing use
a slower generic path whose rows are merged back in call order at flush.

``nbytes`` is the size of the buffer this rank *sends* (input tensor, or the sum of the input
list); 0 for barrier. P2P calls form directional pair groups ``<kind>-<src>-<dst>`` whose k-th send
and k-th recv share ``seq``, like the simulator's pipeline groups.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import socket
import struct
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
# Row layout kept in the buffers, expanded to the file schema at flush time: start and end are
# raw time.perf_counter_ns() readings (end None while an async op or CUDA event is pending).
_IT, _OP, _GIDX, _SEQ, _NBYTES, _START, _END, _PEER = range(8)
# Blocking wall-clock rows (the common case) are packed as 6 native int64 into one preallocated
# bytearray: no Python object survives a call, so the garbage collector never sees the buffer,
# and flush reads the columns with np.frombuffer instead of unzipping tuples. Every argument
# of the pack costs on the hot path, so op code and peer share one field (peer + 1 above
# _PEER_SHIFT bits) and the iteration is not stored: step() records where it changed.
_B_CODE, _B_GIDX, _B_SEQ, _B_NBYTES, _B_START, _B_END = range(6)
_ROW = struct.Struct("@6q")
_PEER_SHIFT = 8  # op codes < 256
# local names of the generated wrappers: a wrapped parameter of one of these names would be
# overwritten before the call, so such a function keeps the generic wrapper
_FAST_LOCALS = frozenset({"nbytes", "gidx", "t0", "t1", "out", "seq", "k", "x"})


def rank_log_path(out_dir: str | Path, rank: int, fmt: str = "arrow") -> Path:
    """Where rank ``rank`` writes its log: ``<out_dir>/commops-rank00003.arrows``."""
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
        ``"arrow"`` (the default: a zstd-compressed Arrow IPC stream, ``.arrows``),
        ``"parquet"`` or ``"jsonl"``. An Arrow stream and JSON Lines (much slower and larger)
        are readable as they grow, up to the last flush, even after a crash: what ``holmes
        agent`` needs to follow a running job. A Parquet file is readable only once closed (its
        footer is written on exit): while the job runs, or after it was killed, the readers
        skip it with a warning. ``holmes bench logger`` times each (``--log-format``).
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
    fmt: str = "arrow"
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
        self._iteration = int(self.config.start_iteration)
        self._it_base = self._iteration  # iteration of the first row in _buf
        self._marks: list[tuple[int, int]] = []  # (rows in _buf, iteration from that row on)
        self.rank = -1
        self.path: Path | None = None
        self._rows: list[list[Any]] = []  # async and CUDA rows: their end is filled in later
        self._buf = bytearray()  # blocking wall-clock rows, _ROW-packed (sized in __enter__)
        self._fill = [0]  # bytes of _buf in use; one cell shared by all wrappers
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
        self._buf = bytearray(int(self.config.flush_every) * _ROW.size)
        self._fill[0] = 0
        self._it_base = self._iteration
        self._marks.clear()
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

    @property
    def iteration(self) -> int:
        """Iteration number written on the calls made from now on."""
        return self._iteration

    @iteration.setter
    def iteration(self, value: int) -> None:
        self._iteration = int(value)
        # packed rows carry no iteration: remember from which buffered row on it applies
        self._marks.append((self._fill[0] // _ROW.size, self._iteration))

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
        # struct.pack_into. Formatting (wall-clock start, µs, group names) waits for flush.
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
        fill = self._fill
        buf = self._buf  # allocated once per __enter__, reused after every flush
        cap = len(buf)
        pack_into = _ROW.pack_into
        step = _ROW.size
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
                k = fill[0]
                pack_into(buf, k, opc | ((peer + 1) << _PEER_SHIFT), gidx, seq, nbytes, t0, t1)
                k += step
                fill[0] = k
                if k >= cap:
                    this.flush()
                return out
            finally:
                busy[0] = False

        wrapper.__name__ = orig.__name__
        wrapper.__doc__ = orig.__doc__
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        if p2p is not None or cuda:
            return wrapper
        fast = self._make_fast_wrapper(orig, opc, tensor_param, size, wrapper)
        return wrapper if fast is None else fast

    def _make_fast_wrapper(
        self, orig: Any, opc: int, tensor_param: str | None, size: str, generic: Any
    ) -> Any:
        """A wrapper with ``orig``'s own parameter list for blocking wall-clock collectives.

        Right after a real operator returns (a thread hand-over in gloo) the interpreter runs
        with cold caches and branch predictors, so every bytecode of the wrapper costs several
        times its warm price. Binding the arguments by ``orig``'s signature (done in C by the
        call itself) removes the generic ``*args/**kwargs`` lookups; the source is generated
        once per function, as :mod:`dataclasses` does. Async calls and nested calls go to
        ``generic``. Returns None when the signature is not plain (``*args``, positional-only),
        in which case the generic wrapper is used.
        """
        params = list(inspect.signature(orig).parameters.values())
        names = [p.name for p in params]
        plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        if (any(p.kind not in plain for p in params) or "group" not in names
                or (tensor_param is not None and tensor_param not in names)
                or any(not n.isidentifier() or n.startswith("_") or n in _FAST_LOCALS
                       for n in names)):
            return None
        env: dict[str, Any] = {
            "_busy": self._busy, "_fill": self._fill, "_buf": self._buf, "_cap": len(self._buf),
            "_pack": _ROW.pack_into, "_step": _ROW.size, "_perf": time.perf_counter_ns,
            "_gcache": self._gfast, "_seqs": self._seq, "_this": self, "_orig": orig,
            "_generic": generic, "_opc": opc,
        }
        sig, call = [], []
        kwonly = False
        for p in params:
            if p.kind is inspect.Parameter.KEYWORD_ONLY and not kwonly:
                sig.append("*")
                kwonly = True
            if p.default is inspect.Parameter.empty:
                sig.append(p.name)
            else:
                env[f"_d_{p.name}"] = p.default
                sig.append(f"{p.name}=_d_{p.name}")
            call.append(f"{p.name}={p.name}" if kwonly else p.name)
        args = ", ".join(call)
        asyn = "async_op or " if "async_op" in names else ""
        nbytes = {"one": f"{tensor_param}.nbytes",
                  "list": f"sum([x.nbytes for x in {tensor_param}])"}.get(size, "0")
        src = f"""
def {orig.__name__}({", ".join(sig)}):
    if {asyn}_busy[0]:
        return _generic({args})
    _busy[0] = True
    try:
        nbytes = {nbytes}
        try:
            gidx = _gcache[group]
        except (KeyError, TypeError):
            gidx = _this._group_index(group)
        seq = _seqs[gidx]
        k = _fill[0]
        t0 = _perf()
        out = _orig({args})
        t1 = _perf()
    finally:
        _busy[0] = False
    _seqs[gidx] = seq + 1
    _pack(_buf, k, _opc, gidx, seq, nbytes, t0, t1)
    k += _step
    _fill[0] = k
    if k >= _cap:
        _this.flush()
    return out
"""
        exec(compile(src, f"<holmes_ml.collect wrapper of {orig.__name__}>", "exec"), env)
        fast = env[orig.__name__]
        fast.__doc__ = orig.__doc__
        fast.__wrapped__ = orig
        return fast

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
        nbuf = self._fill[0] // _ROW.size
        packed = np.frombuffer(self._buf, dtype=np.int64, count=nbuf * _ROW.size // 8)
        packed = packed.reshape(nbuf, _ROW.size // 8)
        col = np.empty((8, nbuf), dtype=np.int64)  # the list-row layout (_IT ... _PEER)
        code = packed[:, _B_CODE]
        col[_OP] = code & ((1 << _PEER_SHIFT) - 1)
        col[_PEER] = (code >> _PEER_SHIFT) - 1
        for dst, src in ((_GIDX, _B_GIDX), (_SEQ, _B_SEQ), (_NBYTES, _B_NBYTES),
                         (_START, _B_START), (_END, _B_END)):
            col[dst] = packed[:, src]
        del packed, code  # release the buffer: the wrappers overwrite it after this flush
        col[_IT] = self._it_base
        if self._marks:
            pos, value = np.asarray(self._marks, dtype=np.int64).T
            last = np.searchsorted(pos, np.arange(nbuf), side="right") - 1
            col[_IT] = np.where(last >= 0, value[np.maximum(last, 0)], self._it_base)
            self._marks.clear()
        self._it_base = self._iteration
        self._fill[0] = 0
        rows = self._rows
        if rows:  # async / CUDA rows: only those whose duration is known go out now
            done = [r for r in rows if r[_END] is not None]
            self._rows = [] if final else [r for r in rows if r[_END] is None]
            if done:
                slow = np.array(done, dtype=np.int64).reshape(len(done), 8).T
                col = np.concatenate([col, slow], axis=1)
                # back into call order: starts are perf_counter_ns readings taken at call time
                col = col[:, np.argsort(col[_START], kind="stable")]
        n = col.shape[1]
        if not n:
            return 0
        start_a = col[_START]
        gidx_a = col[_GIDX]
        names, ranks, kinds = zip(*self._groups, strict=True)
        one = np.zeros(n, dtype=np.int64)
        columns = {
            "iteration": col[_IT],
            "rank": np.full(n, self.rank, dtype=np.int64),
            "op": Coded(col[_OP], _OP_NAMES),
            "group": Coded(gidx_a, names),
            "seq": col[_SEQ],
            "nbytes": col[_NBYTES],
            "start_ns": start_a + self._wall_offset,
            "duration_us": (col[_END] - start_a) / 1000.0,
            "group_ranks": Coded(gidx_a, ranks),
            "group_kind": Coded(gidx_a, kinds),
            "peer": col[_PEER],
            "host": Coded(one, (self._host,)),
            "job": Coded(one, (self.config.job,)),
        }
        self._sink.write(columns)
        return n
