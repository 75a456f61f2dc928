"""Running a simulation and its output: :class:`SimResult`, :func:`simulate`, streaming to disk.

Files written (``DIR``): ``ops.parquet`` (canonical CommOps + ``group_ranks, peer, host,
group_kind, job`` + labels ``abnormal, fault_id, affected``; one Parquet row group per iteration),
``faults.json`` (the resolved faults, :meth:`FaultSpec.to_dict`) and ``topology.json``
(:class:`holmes_ml.topology.Topology`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from holmes_ml.simulator.config import FaultSpec, SimConfig
from holmes_ml.simulator.engine import Engine
from holmes_ml.topology import Topology

logger = logging.getLogger(__name__)

OPS_FILE = "ops.parquet"
FAULTS_FILE = "faults.json"
TOPOLOGY_FILE = "topology.json"
CONFIG_FILE = "config.json"


@dataclass
class SimResult:
    """What :func:`simulate` produced.

    Parameters
    ----------
    ops:
        The CommOps table with labels (string columns are pandas categoricals).
    topology:
        Placement of ranks, fabric and communicators.
    faults:
        The injected faults, resolved (ranks, hosts, links, devices, active iterations).
    config:
        The job description (``SimConfig.to_dict()``), when known.
    """

    ops: pd.DataFrame
    topology: Topology
    faults: list[FaultSpec] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def write(self, out_dir: str | Path) -> Path:
        """Write ``ops.parquet``, ``faults.json``, ``topology.json`` (and ``config.json``)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.ops.to_parquet(out / OPS_FILE, index=False)
        _write_meta(out, self.faults, self.topology, self.config)
        return out


#: Formats :func:`write_rank_logs` writes, with their suffix.
RANK_LOG_FORMATS = {"arrow": ".arrows", "jsonl": ".jsonl", "csv": ".csv", "parquet": ".parquet"}


def write_rank_logs(ops: pd.DataFrame, out_dir: str | Path, fmt: str = "jsonl") -> list[Path]:
    """Write each rank's operators of ``ops``, without the labels, as a logger on that rank
    would: ``OUT_DIR/HOST/rank-RANK.EXT`` in time order (``fmt``: arrow, the logger's default,
    an Arrow IPC stream of one zstd record batch per iteration as the logger flushes them;
    jsonl, csv or parquet).
    One ``holmes agent --follow OUT_DIR/HOST`` per host then ships the job as the deployed path
    does (``holmes serve``); ``holmes localize OUT_DIR`` reads it whole. Returns the files.

    >>> from holmes_ml.simulator import SimConfig, simulate
    >>> import tempfile
    >>> ops = simulate(SimConfig(gpus=16, iterations=2, seed=0)).ops
    >>> files = write_rank_logs(ops, tempfile.mkdtemp(), "csv")
    >>> len(files), files[5].parent.name, files[5].name
    (16, 'node000', 'rank-00005.csv')
    """
    from holmes_ml.io.schema import without_labels

    if fmt not in RANK_LOG_FORMATS:
        raise ValueError(f"rank log format {fmt!r}: expected one of "
                         f"{', '.join(RANK_LOG_FORMATS)}")
    out = Path(out_dir)
    logs = without_labels(ops)
    logs = logs.assign(**{c: logs[c].astype(str) for c in logs.columns
                          if isinstance(logs[c].dtype, pd.CategoricalDtype)})
    width = max(5, len(str(int(logs["rank"].max())))) if len(logs) else 5
    written = []
    for (host, rank), part in logs.groupby(["host", "rank"], sort=True):
        path = out / str(host) / f"rank-{int(rank):0{width}d}{RANK_LOG_FORMATS[fmt]}"
        path.parent.mkdir(parents=True, exist_ok=True)
        part = part.sort_values("start_ns", kind="stable")
        if fmt == "jsonl":
            part.to_json(path, orient="records", lines=True)
        elif fmt == "csv":
            part.to_csv(path, index=False)
        elif fmt == "arrow":
            _write_arrow_stream(part, path)
        else:
            part.to_parquet(path, index=False)
        written.append(path)
    return written


def _write_arrow_stream(part: pd.DataFrame, path: Path) -> None:
    """``part`` as an Arrow IPC stream, a record batch per iteration (zstd, as
    :class:`holmes_ml.collect.writer.RowSink` writes them; every column kept)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(part, preserve_index=False)
    its = part["iteration"].to_numpy()
    cuts = np.flatnonzero(np.diff(its) != 0) + 1 if len(its) else np.empty(0, np.int64)
    with path.open("wb") as fh, pa.ipc.new_stream(
            fh, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as stream:
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(its)], strict=True):
            stream.write_table(table.slice(int(lo), int(hi - lo)))


def _write_meta(out: Path, faults: list[FaultSpec], topology: Topology, config: dict) -> None:
    (out / FAULTS_FILE).write_text(json.dumps([f.to_dict() for f in faults], indent=2))
    topology.to_json(out / TOPOLOGY_FILE)
    if config:
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str))


def simulate(cfg: SimConfig, progress: bool = False) -> SimResult:
    """Simulate a job in memory.

    Parameters
    ----------
    cfg:
        The job and its faults.
    progress:
        Show a tqdm progress bar over iterations.

    Returns
    -------
    SimResult

    Examples
    --------
    >>> from holmes_ml.simulator import FaultSpec, SimConfig, simulate
    >>> res = simulate(SimConfig(gpus=16, model="llama2-7b", iterations=3,
    ...                          faults=(FaultSpec.parse("gpu_slow:rank=3,severity=1"),)))
    >>> bool(res.ops["abnormal"].any()), res.faults[0].devices
    (True, ('gpu:node000/3',))
    """
    engine = Engine(cfg)
    frames = list(engine.iterations(progress=progress))
    ops = pd.concat(frames, ignore_index=True)
    return SimResult(
        ops, engine.cluster.topology, [f.spec for f in engine.faults], _config_dict(cfg, engine)
    )


def simulate_to(cfg: SimConfig, out_dir: str | Path, progress: bool = False) -> dict:
    """Simulate and stream to ``out_dir`` one Parquet row group per iteration (bounded memory).

    Returns a summary: ``rows``, ``abnormal``, ``iterations`` and ``faults`` (resolved dicts).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine = Engine(cfg)
    writer = None
    rows = abnormal = 0
    try:
        for frame in engine.iterations(progress=progress):
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if writer is None:
                writer = pq.ParquetWriter(out / OPS_FILE, table.schema)
            writer.write_table(table)
            rows += len(frame)
            abnormal += int(frame["abnormal"].sum())
    finally:
        if writer is not None:
            writer.close()
    faults = [f.spec for f in engine.faults]
    _write_meta(out, faults, engine.cluster.topology, _config_dict(cfg, engine))
    return {
        "rows": rows,
        "abnormal": abnormal,
        "iterations": cfg.iterations,
        "faults": [f.to_dict() for f in faults],
    }


def _config_dict(cfg: SimConfig, engine: Engine) -> dict:
    d = cfg.to_dict()  # the inputs, faults as given (resolved: faults.json)
    d["derived"] = {"chunks_per_microbatch": engine.chunks}
    return d


def load_result(path: str | Path) -> SimResult:
    """Read a directory written by :meth:`SimResult.write` or :func:`simulate_to`."""
    p = Path(path)
    missing = [n for n in (OPS_FILE, FAULTS_FILE, TOPOLOGY_FILE) if not (p / n).exists()]
    if missing:
        raise ValueError(
            f"{p}: not a simulator output directory (missing {', '.join(missing)}); expected "
            f"{OPS_FILE}, {FAULTS_FILE} and {TOPOLOGY_FILE}"
        )
    ops = pd.read_parquet(p / OPS_FILE)
    try:
        faults = [FaultSpec.from_dict(d) for d in json.loads((p / FAULTS_FILE).read_text())]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{p / FAULTS_FILE}: not a faults list ({exc})") from exc
    topology = Topology.from_json(p / TOPOLOGY_FILE)
    config = json.loads((p / CONFIG_FILE).read_text()) if (p / CONFIG_FILE).exists() else {}
    return SimResult(ops, topology, faults, config)
