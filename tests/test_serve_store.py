"""The service's store reads a window of recent iterations without touching older data."""

from __future__ import annotations

import pyarrow as pa
import pytest
from test_serve_support import make_ops

from holmes_ml.io.schema import validate
from holmes_ml.serve.app import ServeSettings
from holmes_ml.serve.store import Store


def _raw_store(tmp_path) -> Store:
    store = Store(tmp_path / "serve.db")
    ops = validate(make_ops(seed=1, iterations=30))
    for k in range(3):
        part = ops[ops["iteration"] // 10 == k]
        store.ingest_raw("job", "logger", f"b{k}", k, pa.Table.from_pandas(
            part, preserve_index=False), f"digest{k}")
    return store


def test_raw_batches_of_older_iterations_are_not_read(tmp_path):
    store = _raw_store(tmp_path)
    assert store.first_of_last("job", 10) == 20
    assert store.first_of_last("job", 30) is None  # the job has no older iteration
    assert store.first_of_last("job", None) is None
    # a batch whose iterations all lie before the window is never opened: spoil one
    store._db.execute("UPDATE raw SET payload=x'00' WHERE batch_id='b1'")
    assert sorted(store.raw_ops("job", 10)["iteration"].unique()) == list(range(20, 30))
    with pytest.raises(pa.ArrowInvalid):
        store.raw_ops("job")  # everything: the spoilt batch is read
    # a batch without a span (written by an older holmes_ml) is read, and cut to the window
    store._db.execute("DELETE FROM raw_span WHERE batch_id='b0'")
    got = store.raw_ops("job", 10)
    assert sorted(got["iteration"].unique()) == list(range(20, 30))
    store._db.execute("UPDATE raw SET payload=x'00' WHERE batch_id='b0'")
    with pytest.raises(pa.ArrowInvalid):
        store.raw_ops("job", 10)  # b0 has no span, so it is read


def test_a_window_of_iterations_must_be_a_count(tmp_path):
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="--analyze-last"):
            ServeSettings(db=tmp_path / "s.db", analyze_last=bad).check()
    ServeSettings(db=tmp_path / "s.db", analyze_last=0).check()
