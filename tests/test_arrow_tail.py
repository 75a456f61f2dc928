"""Reading a growing Arrow IPC stream log (``.arrows``) a piece at a time: what a follower
of a live log does at every poll. The pieces read must add up to what a reader of the whole
file gets, wherever the file was cut while it grew."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from holmes_ml.collect.writer import Coded, RowSink
from holmes_ml.io import SchemaError
from holmes_ml.io.readers import (
    ArrowStreamRewritten,
    ArrowStreamTail,
    read_arrow_stream,
    read_arrow_stream_tail,
)


def _batch(it: int, groups: list[str], n: int = 12) -> dict:
    """One flush of a rank's logger: ``groups`` is the group list it knows so far (a group
    created later grows the dictionaries, which the stream then sends again)."""
    g = np.arange(n) % len(groups)
    return {"iteration": np.full(n, it), "rank": np.zeros(n, dtype=np.int64),
            "op": Coded(np.zeros(n, dtype=np.int64), ["all_reduce"]),
            "group": Coded(g, groups), "seq": np.arange(n) + it * n,
            "nbytes": np.full(n, 1 << 20), "start_ns": 10**18 + it * 10**9 + np.arange(n),
            "duration_us": np.full(n, 100.0) + it,
            "group_ranks": Coded(g, [" ".join(map(str, range(i + 2))) for i in range(len(groups))]),
            "group_kind": Coded(g, ["dp"] * len(groups)), "peer": np.full(n, -1),
            "host": Coded(np.zeros(n, dtype=np.int64), ["h0"]),
            "job": Coded(np.zeros(n, dtype=np.int64), ["j"])}


def _log(path, flushes: int = 5):
    """A stream of ``flushes`` batches whose dictionaries change twice (new groups)."""
    sink = RowSink(path, "arrow")
    groups = ["dp-0"]
    for it in range(flushes):
        if it in (2, 4):
            groups = [*groups, f"dp-{len(groups)}"]
        sink.write(_batch(it, groups))
    return sink


def _frame(table: pa.Table) -> pd.DataFrame:
    df = table.to_pandas()
    if "group_ranks" in df:
        df["group_ranks"] = df["group_ranks"].astype(str)  # categories differ piece by piece
    return df


def _follow(path, cuts, max_bytes=64 << 20):
    """Tail ``path`` as it grows to each of the sizes in ``cuts`` (a copy of its bytes written
    in that many steps); returns the pieces read and the last tail."""
    data = path.read_bytes()
    live = path.with_name("live.arrows")
    live.write_bytes(b"")
    tail, pieces = ArrowStreamTail(), []
    for cut in cuts:
        live.write_bytes(data[:cut])
        while True:  # a bound below the new bytes: caught up over several calls
            before = tail.offset
            table, tail = read_arrow_stream_tail(live, tail, max_bytes)
            if table is not None:
                pieces.append(_frame(table))
            if tail.offset == before:
                break
    return pieces, tail


@pytest.mark.parametrize("closed", [True, False])
def test_pieces_read_as_the_stream_grows_add_up_to_the_whole(tmp_path, closed):
    sink = _log(tmp_path / "r.arrows")
    if closed:
        sink.close()
    whole = _frame(read_arrow_stream(sink.path))
    size = sink.path.stat().st_size
    # every 7th byte: cuts inside the schema, the prefixes, the metadata and the bodies
    pieces, tail = _follow(sink.path, [*range(0, size, 7), size])
    if not closed:
        sink.close()
    got = pd.concat(pieces, ignore_index=True)
    pd.testing.assert_frame_equal(got, whole)
    assert len(whole) == 5 * 12 and set(whole["group"]) == {"dp-0", "dp-1", "dp-2"}
    assert tail.offset == size and tail.rows == len(whole) and tail.ended is closed
    # nothing new: nothing read
    assert read_arrow_stream_tail(sink.path.with_name("live.arrows"), tail)[0] is None


def test_each_poll_reads_only_the_batches_written_since_the_last(tmp_path):
    sink = _log(tmp_path / "r.arrows", flushes=0)
    tail = ArrowStreamTail()
    groups = ["dp-0"]
    try:
        for it in range(4):
            if it == 2:
                groups = [*groups, "dp-1"]
            before = tail.offset
            sink.write(_batch(it, groups))
            table, tail = read_arrow_stream_tail(sink.path, tail)
            assert table is not None and set(table.column("iteration").to_pylist()) == {it}
            assert tail.offset == sink.path.stat().st_size > before
            assert set(table.column("group").to_pylist()) == set(groups)
    finally:
        sink.close()


def test_a_message_larger_than_the_read_bound_is_read_whole(tmp_path):
    sink = _log(tmp_path / "r.arrows")
    sink.close()
    whole = _frame(read_arrow_stream(sink.path))
    size = sink.path.stat().st_size
    pieces, tail = _follow(sink.path, [size // 3, size], max_bytes=64)
    assert tail.offset == size
    pd.testing.assert_frame_equal(pd.concat(pieces, ignore_index=True), whole)


def test_dictionary_deltas_of_another_writer_are_applied(tmp_path):
    """pyarrow writes a grown dictionary as a delta when asked to: the new batches' codes
    refer to the values of both the first dictionary and the delta."""
    schema = pa.schema([("op", pa.dictionary(pa.int32(), pa.string())), ("seq", pa.int64())])
    path = tmp_path / "d.arrows"
    values = ["all_reduce", "all_gather", "send", "recv"]
    with path.open("wb") as fh, pa.ipc.new_stream(
            fh, schema, options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)) as w:
        for k in (1, 2, 4):
            codes = pa.array(np.arange(k, dtype=np.int32))
            w.write_batch(pa.record_batch(
                [pa.DictionaryArray.from_arrays(codes, pa.array(values[:k])),
                 pa.array(np.arange(k))], schema=schema))
            fh.flush()
    pieces, tail = _follow(path, [*range(0, path.stat().st_size, 5), path.stat().st_size])
    got = [op for piece in pieces for op in piece["op"]]
    assert got == ["all_reduce", "all_reduce", "all_gather", *values]
    assert tail.dictionaries[0][0] == 0 and len(tail.dictionaries[0][1]) == 3  # first + 2 deltas


def test_a_file_that_is_no_stream_is_refused_naming_it(tmp_path):
    bad = tmp_path / "notes.arrows"
    bad.write_bytes(b"rank,op\n0,all_reduce\n")
    with pytest.raises(SchemaError, match=r"notes\.arrows.*Arrow IPC stream"):
        read_arrow_stream_tail(bad, ArrowStreamTail())
    # a stream's first bytes, the rest still to come: nothing to read yet, not an error
    sink = _log(tmp_path / "r.arrows", flushes=1)
    sink.close()
    head = tmp_path / "head.arrows"
    head.write_bytes(sink.path.read_bytes()[:10])
    assert read_arrow_stream_tail(head, ArrowStreamTail()) == (None, ArrowStreamTail())


@pytest.mark.parametrize("closed", [True, False])
def test_another_stream_written_in_place_is_told_from_growth(tmp_path, closed):
    """A restarted writer's new file may get the old one's inode and outgrow it before the
    next poll: neither its size nor its inode tells, its bytes do."""
    old = _log(tmp_path / "old.arrows", flushes=2)
    if closed:
        old.close()
    table, tail = read_arrow_stream_tail(old.path, ArrowStreamTail())
    assert table is not None and table.num_rows == 24
    new = RowSink(tmp_path / "new.arrows", "arrow")  # another run: other iterations
    for it in range(10, 14):
        new.write(_batch(it, ["dp-0"]))
    new.close()
    with old.path.open("r+b") as fh:  # same inode, more bytes
        fh.truncate(0)
        fh.write(new.path.read_bytes())
    assert old.path.stat().st_size > tail.offset
    with pytest.raises(ArrowStreamRewritten, match="another Arrow stream was written"):
        read_arrow_stream_tail(old.path, tail)
    if not closed:
        old.close()
