"""``holmes bench latency``'s rank logs: written as the logger writes them (the bench itself
takes minutes, and is run as a benchmark)."""

from __future__ import annotations

import pyarrow as pa


def test_rank_logs_as_the_logger_writes_them_read_back_whole(tmp_path):
    """``holmes bench latency`` (and ``scripts/rank_logs_read.py``) write a job's rank logs as
    the logger does: every operator read back, and an Arrow stream holds only its rank's
    values (a rank's own host, not the job's every host)."""
    from holmes_ml import pipeline
    from holmes_ml.bench.latency import _logger_files
    from holmes_ml.simulator import SimConfig, simulate

    ops = simulate(SimConfig(gpus=16, iterations=3, seed=1)).ops
    for fmt in ("parquet", "arrow"):
        _logger_files(ops, tmp_path / fmt, fmt)
        assert len(list((tmp_path / fmt).iterdir())) == 16
        assert len(pipeline.read_paths([tmp_path / fmt])) == len(ops)
    with pa.OSFile(str(tmp_path / "arrow" / "rank-00009.arrows")) as fh:
        stream = pa.ipc.open_stream(fh).read_all()
    assert stream.column("host").chunk(0).dictionary.to_pylist() == ["node001"]
