"""The service's store reads a window of recent iterations without touching older data."""

from __future__ import annotations

import sqlite3

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from test_serve_support import ANALYZERS, TOKEN, auth, make_ops, window_batch

from holmes_ml.io.schema import validate
from holmes_ml.serve.app import ServeSettings, create_app
from holmes_ml.serve.store import VERDICTS_KEPT, ConflictError, Store


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
    assert store.first_of_last("job", 30) == 0
    assert store.first_of_last("job", 31) is None  # the job has not run that long
    assert store.first_of_last("job", None) is None
    # a batch whose iterations all lie before the window is never opened: spoil one
    store._db.execute("UPDATE raw SET payload=x'00' WHERE batch_id='b1'")
    assert sorted(store.raw_ops("job", 10)["iteration"].unique()) == list(range(20, 30))
    with pytest.raises(pa.ArrowInvalid):
        store.raw_ops("job")  # everything: the spoilt batch is read
    # a batch whose iterations are unknown is read, and cut to the window
    store._db.execute("UPDATE batches SET last_iteration=NULL WHERE batch_id='b0'")
    got = store.raw_ops("job", 10)
    assert sorted(got["iteration"].unique()) == list(range(20, 30))
    store._db.execute("UPDATE raw SET payload=x'00' WHERE batch_id='b0'")
    with pytest.raises(pa.ArrowInvalid):
        store.raw_ops("job", 10)  # b0 has no span, so it is read


def test_pruning_deletes_only_rows_before_the_kept_iterations(tmp_path):
    store = _raw_store(tmp_path)
    assert store.prune("job", 30) == {}  # nothing older than the 30 most recent
    # b0 (0-9) is wholly old: its payload and its record go
    assert store.prune("job", 15) == {"raw_iterations": 15, "raw_batches": 1, "batches": 1}
    # b1 (10-19) holds kept iterations too: it stays, and a window cuts it
    assert sorted(store.raw_ops("job")["iteration"].unique()) == list(range(10, 30))
    assert sorted(store.raw_ops("job", 15)["iteration"].unique()) == list(range(15, 30))
    assert store.job("job")["records"] == 8 * 6 * 30  # accepted, as before
    empty = pa.table({"rank": pa.array([], pa.int64())})
    # a resend of b0 is known by its seq: a duplicate that stores nothing
    again = store.ingest_raw("job", "logger", "b0", 0, empty, "other content")
    assert again["duplicate"] and again["records"] == 0
    # b1's record stays: its resend gets the stored answer, other content is refused
    assert store.ingest_raw("job", "logger", "b1", 1, empty, "digest1")["records"] == 8 * 6 * 10
    with pytest.raises(ConflictError, match="different content"):
        store.ingest_raw("job", "logger", "b1", 1, empty, "other content")
    # above the pruned seq, a step back is still out of order
    with pytest.raises(ConflictError, match="increasing seq"):
        store.ingest_raw("job", "logger", "b9", 1, empty, "digest9")
    assert store.counts()["raw"] == 2


#: The first tables of a database as holmes_ml made them at schema version 1 (before batch
#: records were pruned).
_V1_META_AND_BATCHES = """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE batches (
            job TEXT NOT NULL, source TEXT NOT NULL, batch_id TEXT NOT NULL, seq INTEGER,
            digest TEXT NOT NULL, records INTEGER NOT NULL, ack TEXT NOT NULL,
            received_at REAL NOT NULL, PRIMARY KEY (job, source, batch_id));
"""


def test_a_store_older_than_pruning_gets_its_columns(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    # the tables as holmes_ml made them before batch records were pruned
    db.executescript(_V1_META_AND_BATCHES + """
        CREATE TABLE sources (job TEXT NOT NULL, source TEXT NOT NULL,
            last_seq INTEGER NOT NULL, PRIMARY KEY (job, source));
        CREATE TABLE raw_span (
            job TEXT NOT NULL, source TEXT NOT NULL, batch_id TEXT NOT NULL,
            first_iteration INTEGER NOT NULL, last_iteration INTEGER NOT NULL,
            PRIMARY KEY (job, source, batch_id));
        INSERT INTO meta VALUES ('schema_version', '1');
        INSERT INTO batches VALUES ('job', 'a', 'b0', 0, 'd', 1, '{}', 0);
        INSERT INTO batches VALUES ('job', 'a', 'b1', 1, 'd', 1, '{}', 0);
        INSERT INTO raw_span VALUES ('job', 'a', 'b1', 3, 7);
        INSERT INTO sources VALUES ('job', 'a', 1);""")
    db.close()
    store = Store(path)
    # b1's iterations were recorded apart (raw_span); b0's not at all
    assert store._query("SELECT batch_id, last_iteration FROM batches ORDER BY batch_id") == [
        ("b0", None), ("b1", 7)]
    assert store._query("SELECT pruned_seq FROM sources") == [(-1,)]
    assert store._query("SELECT name FROM sqlite_master WHERE name='raw_span'") == []
    assert store._query("SELECT value FROM meta") == [("4",)]


def test_a_job_kept_to_its_recent_iterations_stops_growing(tmp_path):
    store = Store(tmp_path / "s.db")
    # a verdict body about as large as a real one with a few candidates and their evidence
    verdict = {"candidates": [{"kind": "gpu", "evidence": ["rank 0 arrived last " * 4] * 12}]}
    pages = {}
    for seq in range(400):
        store.ingest_agent("job", window_batch(seq, range(seq, seq + 1), 0), f"d{seq}")
        store.save_verdict("job", verdict, seq + 1, None)
        store.prune("job", 50)
        if seq + 1 in (200, 400):
            pages[seq + 1] = store._query("PRAGMA page_count")[0][0]
    # each step adds a batch record, two iteration rows, an abnormal op and a verdict (about
    # 2 KB); 200 steps more would be over 100 pages of 4 KB if any of them stayed
    assert pages[400] <= pages[200] + 4, pages
    assert store.counts()["verdicts"] == VERDICTS_KEPT
    assert store._query("SELECT count(*), min(seq) FROM batches") == [(50, 350)]
    # the whole job is still known: its record count and the latest verdict's version
    assert store.job("job")["records"] == 400 * 6
    assert store.latest_verdict("job")["version"] == 400
    assert store.ingest_agent("job", window_batch(10, range(10, 11), 0), "x")["duplicate"]


def test_a_service_keeping_250_iterations_stops_growing_and_still_knows_old_batches(tmp_path):
    settings = ServeSettings(db=tmp_path / "s.db", token=TOKEN, analyze_interval_s=0,
                             analyze_last=200, keep_iterations=250)
    parts = [(range(0, 100), 1), (range(100, 250), None), (range(250, 300), 0)]
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:
        for seq, (its, slow) in enumerate(parts):
            assert c.post("/v1/jobs/k/batches", json=window_batch(seq, its, slow),
                          headers=auth()).status_code == 200
        assert c.post("/v1/jobs/k/analyze", headers=auth()).json()["candidates"][0][
            "ranks"] == [0]
        its = c.get("/v1/jobs/k/iterations", params={"last": 0}).json()
        assert [r["iteration"] for r in its] == list(range(50, 300))
        assert 'holmes_pruned_rows_total{table="iterations"} 100.0' in c.get("/metrics").text
        again = c.post("/v1/jobs/k/batches", json=window_batch(0, parts[0][0], 1),
                       headers=auth())
        assert again.status_code == 200 and again.json()["duplicate"], again.text
        assert again.json()["records"] == 100 * 2 * 3  # its record is kept: the stored answer
        db = sqlite3.connect(tmp_path / "s.db")
        assert db.execute("SELECT min(iteration), sum(n) FROM abnormal_records").fetchone() == (50, 100)
        # 100 iterations more: batch 0 (iterations 0-99) now lies wholly before the kept ones
        assert c.post("/v1/jobs/k/batches", json=window_batch(3, range(300, 400), None),
                      headers=auth()).status_code == 200
        c.post("/v1/jobs/k/analyze", headers=auth())
        assert 'holmes_pruned_rows_total{table="batches"} 1.0' in c.get("/metrics").text
        again = c.post("/v1/jobs/k/batches", json=window_batch(0, parts[0][0], 1),
                       headers=auth())
        assert again.status_code == 200 and again.json()["duplicate"], again.text
        assert again.json()["records"] == 0  # known by its seq, nothing stored
        assert db.execute("SELECT count(*) FROM iteration_blocks WHERE iteration<150").fetchone() == (0,)
        assert c.get("/v1/jobs/k").json()["records"] == 400 * 2 * 3


def test_a_window_of_iterations_must_be_a_count(tmp_path):
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="--analyze-last"):
            ServeSettings(db=tmp_path / "s.db", analyze_last=bad).check()
    ServeSettings(db=tmp_path / "s.db", analyze_last=0).check()
    for bad, last in ((-1, 200), (199, 200), (300, 0), (2.5, 200)):
        with pytest.raises(ValueError, match="--keep-iterations"):
            ServeSettings(db=tmp_path / "s.db", analyze_last=last, keep_iterations=bad).check()
    ServeSettings(db=tmp_path / "s.db", keep_iterations=200).check()


def test_large_requests_at_once_must_be_a_positive_count(tmp_path):
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="--large-at-once"):
            ServeSettings(db=tmp_path / "s.db", max_large_requests=bad).check()
    ServeSettings(db=tmp_path / "s.db", max_large_requests=1).check()


def test_a_deleted_job_leaves_nothing_behind(tmp_path):
    settings = ServeSettings(db=tmp_path / "s.db", token=TOKEN, analyze_interval_s=0)
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:
        for job in ("done", "running"):
            for seq in range(2):
                assert c.post(f"/v1/jobs/{job}/batches", headers=auth(), json=window_batch(
                    seq, range(10 * seq, 10 * seq + 10), 0)).status_code == 200
            assert c.post(f"/v1/jobs/{job}/analyze", headers=auth()).json()["candidates"]
        assert c.delete("/v1/jobs/done").status_code == 401  # a write: the token is needed
        r = c.delete("/v1/jobs/done", headers=auth())
        assert r.status_code == 200, r.text
        deleted = r.json()["deleted"]
        assert deleted["jobs"] == 1 and deleted["batches"] == 2 and deleted["verdicts"] == 1
        assert deleted["iterations"] == 40 and deleted["abnormal"] == 20
        assert c.get("/v1/jobs/done").status_code == 404
        db = sqlite3.connect(tmp_path / "s.db")
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            if table != "meta":
                assert db.execute(f"SELECT count(*) FROM {table} WHERE job='done'").fetchone() \
                    == (0,), table
        again = c.delete("/v1/jobs/done", headers=auth())
        assert again.status_code == 404 and "unknown job 'done'" in again.json()["detail"]
        assert [j["job"] for j in c.get("/v1/jobs").json()] == ["running"]
        assert 'job="done"' not in c.get("/metrics").text
        # the other job is whole
        assert c.get("/v1/jobs/running").json()["records"] == 20 * 2 * 3
        assert c.get("/v1/jobs/running/verdict").json()["candidates"][0]["ranks"] == [0]
        # a batch sent afterwards starts a new job of that name: nothing remembers the old one
        r = c.post("/v1/jobs/done/batches", headers=auth(), json=window_batch(0, range(10), 0))
        assert r.status_code == 200 and not r.json()["duplicate"]


def test_pruning_and_deleting_give_the_space_back_to_the_file_system(tmp_path):
    import numpy as np

    from holmes_ml.bench.serve import _store_late_rank_job

    path = tmp_path / "s.db"
    store = Store(path)
    _store_late_rank_job(store, 256, 0, 100, np.random.default_rng(0), step=10)

    def size() -> int:
        store._query("PRAGMA wal_checkpoint(TRUNCATE)")  # the file shrinks at a checkpoint
        return path.stat().st_size

    full = size()
    assert store.prune("job", 20)["iterations"] == 80 * 256
    pruned = size()
    assert pruned < 0.35 * full, (pruned, full)
    store.delete_job("job")
    assert size() < 0.2 * pruned


def _summaries(source: str, seq: int, rows: list[tuple[int, int, int]], abnormal=()) -> dict:
    """An agent batch of (iteration, rank, n_ops) summaries and abnormal (iteration, rank)."""
    body = {"source": source, "batch_id": f"{source}-{seq}", "seq": seq, "iterations": {
        "iteration": [i for i, _, _ in rows], "rank": [r for _, r, _ in rows],
        "start_ns": [i * 1000 for i, _, _ in rows], "end_ns": [i * 1000 + 900 for i, _, _ in rows],
        "comm_us": [0.5] * len(rows), "n_ops": [n for _, _, n in rows]}}
    if abnormal:
        k = len(abnormal)
        body["abnormal"] = {"iteration": [i for i, _ in abnormal], "rank": [r for _, r in abnormal],
                            "op": ["all_reduce"] * k, "group": ["dp-0"] * k, "seq": [0] * k,
                            "nbytes": [8] * k, "start_ns": [0] * k, "duration_us": [0.9] * k,
                            "score": [0.97] * k}
    return body


def _tuples(frame, *columns: str) -> list[tuple]:
    return list(frame[list(columns)].itertuples(index=False, name=None))


def test_an_iteration_shipped_again_replaces_that_ranks_summary_alone(tmp_path):
    store = Store(tmp_path / "s.db")
    store.ingest_agent("job", _summaries("n1", 0, [(5, 1, 3)], abnormal=[(5, 1)]), "a")
    store.ingest_agent("job", _summaries("n2", 0, [(5, 3, 4), (5, 2, 4)], [(5, 2)]), "b")
    # more of rank 1's iteration 5 was logged after a flush; rank 0 appears for the first time
    store.ingest_agent("job", _summaries("n1", 1, [(5, 0, 3), (5, 1, 7), (6, 1, 2)]), "c")
    got = store.iteration_summaries("job")
    assert _tuples(got, "iteration", "rank", "n_ops") == [
        (5, 0, 3), (5, 1, 7), (5, 2, 4), (5, 3, 4), (6, 1, 2)]
    assert list(got.dtypes) == ["int64"] * 4 + ["float64", "int64"]
    # rank 1's abnormal op of the old summary went with it; rank 2's (another agent) stays
    assert store.agent_data("job")["abnormal"]["rank"].tolist() == [2]
    # an abnormal op sent again (same rank, communicator, seq, peer) replaces the one stored
    again = _summaries("n2", 1, [], abnormal=[(5, 2), (5, 3)])
    again["abnormal"]["score"] = [0.5, 0.6]
    store.ingest_agent("job", again, "d")
    ab = store.agent_data("job")["abnormal"]
    assert _tuples(ab, "rank", "score") == [(2, 0.5), (3, 0.6)]
    # 88 bytes an operator, its strings numbered once per job
    assert store._query("SELECT n, length(rows) FROM abnormal_records WHERE source='n2'") == [
        (2, 2 * 88)]
    assert store._query("SELECT text FROM names ORDER BY id") == [("all_reduce",), ("dp-0",),
                                                                    ("",)]
    assert store.counts()["abnormal"] == 2
    assert store.job("job")["records"] == 3 + 8 + (3 + 7 - 3 + 2)
    assert store.counts()["iterations"] == 5
    assert store.first_of_last("job", 1) == 6
    # the batches that held iteration 5 alone go too
    assert store.prune("job", 1) == {"iterations": 4, "abnormal": 2, "batches": 3}
    assert store.iteration_summaries("job")["rank"].tolist() == [1]


def test_compute_times_travel_with_their_summaries(tmp_path):
    store = Store(tmp_path / "s.db")
    store.ingest_agent("job", _summaries("n2", 0, [(5, 2, 4), (6, 2, 4)]), "a")
    # a job's first compute times: none stored for an agent that sends none
    assert "compute_us" not in store.iteration_summaries("job")
    assert store._query("SELECT count(*) FROM compute_blocks") == [(0,)]
    body = _summaries("n1", 0, [(5, 0, 3), (5, 1, 3), (5, 3, 3), (6, 0, 3), (6, 1, 3)])
    body["iterations"]["compute_us"] = [900.0, None, 800.0, 910.0, 920.0]  # none: not logged
    store.ingest_agent("job", body, "b")
    got = store.iteration_summaries("job")
    assert _tuples(got, "iteration", "rank") == [(5, 0), (5, 1), (5, 2), (5, 3), (6, 0), (6, 1),
                                                 (6, 2)]
    assert got["compute_us"].fillna(-1).tolist() == [900.0, -1, -1, 800.0, 910.0, 920.0, -1]
    # a rank's summary sent again replaces its compute time, and drops it when sent without
    again = _summaries("n1", 1, [(6, 0, 5), (6, 1, 5)])
    again["iterations"]["compute_us"] = [None, 990.0]
    store.ingest_agent("job", again, "c")
    store.ingest_agent("job", _summaries("n1", 2, [(5, 0, 5)]), "d")
    got = store.iteration_summaries("job").set_index(["iteration", "rank"])["compute_us"]
    assert got.dropna().to_dict() == {(5, 3): 800.0, (6, 1): 990.0}
    assert store.agent_data("job", last=1)["iterations"]["compute_us"].tolist()[1] == 990.0
    # pruned with the summaries, and deleted with the job
    assert store.prune("job", 1) == {"iterations": 4, "compute": 1, "batches": 1}
    assert store.delete_job("job")["compute"] == 1


def test_a_topology_set_after_a_verdict_makes_it_stale(tmp_path):
    # The topology names the devices and each rank's coordinates: a verdict computed before it
    # came is recomputed, though no batch came since.
    settings = ServeSettings(db=tmp_path / "serve.db", token=TOKEN,
                             analyze_interval_s=0)
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:
        assert c.post("/v1/jobs/j/batches", json=window_batch(0, range(6), slow_rank=1),
                      headers=auth()).status_code == 200
        first = c.post("/v1/jobs/j/analyze", headers=auth()).json()
        assert first["version"] == 1 and not first["stale"]
        topology = {"ranks": {"rank": [0, 1], "host": ["h0", "h0"], "gpu": [0, 1], "pod": [0, 0],
                              "dp": [0, 1]}, "groups": []}
        r = c.put("/v1/jobs/j/topology", json=topology, headers=auth())
        assert r.status_code == 200, r.text
        assert c.get("/v1/jobs/j/verdict").json()["stale"]
        second = c.post("/v1/jobs/j/analyze", headers=auth()).json()
        assert second["version"] == 2 and not second["stale"]
        assert c.post("/v1/jobs/j/analyze", headers=auth()).json()["version"] == 2
        # a refused topology names the key at fault (it always said "ranks")
        bad = dict(topology, groups=[{"name": "dp-0", "kind": "dp", "ranks": [0, 7]}])
        r = c.put("/v1/jobs/j/topology", json=bad, headers=auth())
        assert r.status_code == 422 and r.json()["field"] == "groups[0].ranks", r.text


def test_a_version_1_database_is_converted_on_opening(tmp_path, monkeypatch, caplog):
    from functools import partial

    from holmes_ml.serve import store as store_module

    # converted one iteration at a time (1,000 in the service), as a large database would be
    monkeypatch.setattr(store_module, "_legacy_rows",
                        partial(store_module._legacy_rows, iterations=1))
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    # the iteration summaries as holmes_ml stored them before they were packed per agent
    db.executescript(_V1_META_AND_BATCHES + """
        CREATE TABLE iterations (
            job TEXT NOT NULL, iteration INTEGER NOT NULL, rank INTEGER NOT NULL,
            start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, comm_us REAL NOT NULL,
            n_ops INTEGER NOT NULL, PRIMARY KEY (job, iteration, rank));
        CREATE TABLE abnormal (
            job TEXT NOT NULL, iteration INTEGER NOT NULL, rank INTEGER NOT NULL,
            op TEXT NOT NULL, grp TEXT NOT NULL, seq INTEGER NOT NULL, nbytes INTEGER NOT NULL,
            start_ns INTEGER NOT NULL, duration_us REAL NOT NULL, score REAL NOT NULL,
            peer INTEGER NOT NULL DEFAULT -1, host TEXT NOT NULL DEFAULT '',
            group_kind TEXT NOT NULL DEFAULT '', excess_us REAL NOT NULL DEFAULT 0,
            PRIMARY KEY (job, iteration, rank, grp, seq, peer));
        CREATE TABLE facts (
            job TEXT NOT NULL, fact TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
            source TEXT NOT NULL, batch_id TEXT NOT NULL, PRIMARY KEY (job, fact, key));
        INSERT INTO meta VALUES ('schema_version', '1');""")
    db.executemany("INSERT INTO iterations VALUES (?,?,?,?,?,?,?)", [
        (job, it, rank, it * 10 + rank, it * 10 + 9, 0.25 * rank, rank + 1)
        for job in ("j", "k") for it in (1, 0) for rank in (3, 0, 2, 1)])
    db.executemany("INSERT INTO abnormal VALUES (?,?,?,'all_reduce',?,?,8,0,0.9,?,-1,'','',0)",
                   [(job, it, rank, grp, seq, score) for job in ("j", "k") for it, rank, grp, seq,
                    score in ((1, 3, "dp-1", 0, 0.8), (1, 0, "dp-0", 4, 0.9), (0, 2, "dp-0", 4, 0.7),
                              (1, 1, "dp-0", 4, 0.6))])
    db.executemany("INSERT INTO facts VALUES (?, 'ranks', ?, ?, ?, 'b0')",
                   [(job, str(r), s, s) for job in ("j", "k") for r, s in
                    ((0, "a"), (1, "b"), (3, "a"))])  # rank 2: no agent on record
    db.commit()
    db.close()
    with caplog.at_level("WARNING", logger="holmes_ml.serve.store"):
        store = Store(path)
    # the one long step is announced before it starts: a service that seems stuck says why
    assert "rewriting the database once" in caplog.text and "starts when it is done" in \
        caplog.text
    assert store._query("SELECT value FROM meta") == [("4",)]
    assert store._query("SELECT name FROM sqlite_master WHERE name IN ('iterations', "
                        "'abnormal')") == []
    # made without incremental vacuum, it was rewritten once with it: pruning now shrinks it
    assert store._query("PRAGMA auto_vacuum") == [(2,)]
    assert store._query("SELECT job, iteration, source, n FROM iteration_blocks "
                        "WHERE job='j' ORDER BY iteration, source") == [
        ("j", 0, "", 1), ("j", 0, "a", 2), ("j", 0, "b", 1),
        ("j", 1, "", 1), ("j", 1, "a", 2), ("j", 1, "b", 1)]
    got = store.iteration_summaries("j")
    assert got.to_dict("list") == {
        "iteration": [0] * 4 + [1] * 4, "rank": [0, 1, 2, 3] * 2,
        "start_ns": [0, 1, 2, 3, 10, 11, 12, 13], "end_ns": [9] * 4 + [19] * 4,
        "comm_us": [0.0, 0.25, 0.5, 0.75] * 2, "n_ops": [1, 2, 3, 4] * 2}
    ab = store.agent_data("j")["abnormal"]
    assert _tuples(ab, "iteration", "group", "seq", "rank", "score") == [
        (0, "dp-0", 4, 2, 0.7), (1, "dp-0", 4, 0, 0.9), (1, "dp-0", 4, 1, 0.6),
        (1, "dp-1", 0, 3, 0.8)]
    assert store.agent_data("j", abnormal_last=1)["abnormal"]["iteration"].tolist() == [1] * 3
    # agent a ships rank 3's iteration 1 again: its converted summary is the one replaced,
    # and its abnormal op goes with it
    store._db.execute("INSERT INTO jobs (job, created_at, mode) VALUES ('j', 0, 'agent')")
    store.ingest_agent("j", _summaries("a", 5, [(1, 3, 9)]), "d")
    assert store.iteration_summaries("j", 1)["n_ops"].tolist() == [1, 2, 3, 9]
    assert store.agent_data("j", 1)["abnormal"]["rank"].tolist() == [0, 1]
    assert store.counts()["iterations"] == 16
    store.close()
    again = Store(path)  # opened again: nothing to convert
    assert again.iteration_summaries("k").equals(got)
    assert again.agent_data("k")["abnormal"].equals(ab)


def test_a_database_of_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(ValueError, match="schema version 5; expected 4 or older"):
        Store(path)


def test_a_version_3_database_gains_compute_times_and_topology_versions(tmp_path):
    # Version 3 had no compute_blocks and no topology_version: an older holmes_ml would fail
    # to save a verdict into the new verdicts table, so the version says it (4) and an older
    # one refuses the file; this one adds what is missing and keeps every row.
    path = tmp_path / "v3.db"
    store = Store(path)
    store.ingest_agent("j", _summaries("a", 0, [(0, 0, 3), (0, 1, 3)]), "a")
    store.save_verdict("j", {"candidates": []}, 1, None)
    store.close()
    db = sqlite3.connect(path)
    for table in ("jobs", "verdicts"):
        db.execute(f"ALTER TABLE {table} DROP COLUMN topology_version")
    db.execute("DROP TABLE compute_blocks")
    db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    db.commit()
    db.close()
    store = Store(path)
    assert store._query("SELECT value FROM meta WHERE key='schema_version'") == [("4",)]
    assert store.job("j")["topology_version"] == 0
    assert store.latest_verdict("j")["topology_version"] == 0
    assert store.iteration_summaries("j")["n_ops"].tolist() == [3, 3]
    store.set_topology("j", {"ranks": {}})
    assert store.job("j")["topology_version"] == 1
    body = _summaries("a", 1, [(1, 0, 3)])
    body["iterations"]["compute_us"] = [5.0]
    store.ingest_agent("j", body, "b")
    assert store.iteration_summaries("j")["compute_us"].fillna(0).tolist() == [0, 0, 5.0]


def test_compute_times_over_http_take_null_and_refuse_negatives_naming_the_field(tmp_path):
    settings = ServeSettings(db=tmp_path / "serve.db", token=TOKEN, analyze_interval_s=0)
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:
        body = window_batch(0, range(3), slow_rank=None)
        body["iterations"]["compute_us"] = [900.0, None] * 3  # rank 1 logs none
        bad = dict(body, batch_id="bad", seq=1,
                   iterations=dict(body["iterations"], compute_us=[900.0, -1.0] * 3))
        r = c.post("/v1/jobs/j/batches", json=bad, headers=auth())
        assert r.status_code == 422 and "compute_us" in r.text, r.text
        r = c.post("/v1/jobs/j/batches", json=body, headers=auth())
        assert r.status_code == 200, r.text
        assert c.get("/v1/jobs/j").json()["batches"] == 1  # the refused one stored nothing


def test_a_jobs_record_count_stays_a_64_bit_integer(tmp_path):
    """Summed over batches in SQL, the count would turn into a float past 2**63 and every
    job listing would fail on it; it is held at the maximum instead."""
    store = _raw_store(tmp_path)
    with sqlite3.connect(tmp_path / "serve.db") as db:
        db.execute("UPDATE jobs SET records=? WHERE job='job'", (2**63 - 5,))
    ops = validate(make_ops(seed=1, iterations=40))
    store.ingest_raw("job", "logger", "b3", 3, pa.Table.from_pandas(
        ops[ops["iteration"] >= 30], preserve_index=False), "digest3")
    assert store.job("job")["records"] == 2**63 - 1
    assert isinstance(store.job("job")["records"], int)


def test_a_job_whose_localization_fails_is_not_retried_until_it_changes(tmp_path, monkeypatch):
    """The background loop ran a failing job's whole localization (and logged its traceback)
    every few seconds; now it waits for the job to change. An explicit request still tries."""
    import holmes_ml.serve.app as app_module
    from holmes_ml.serve.app import Service

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(app_module, "compute_verdict", failing)
    store = _raw_store(tmp_path)
    service = Service(store=store, analyzers=ANALYZERS)
    service.analyze_dirty()
    assert len(calls) == 1 and service.errors["job"] == "localization failed: RuntimeError: boom"
    service.analyze_dirty()
    service.analyze_dirty()
    assert len(calls) == 1  # same data: not tried again
    service.analyze("job")  # asked for: tried
    assert len(calls) == 2
    ops = validate(make_ops(seed=1, iterations=40))
    store.ingest_raw("job", "logger", "b3", 3, pa.Table.from_pandas(
        ops[ops["iteration"] >= 30], preserve_index=False), "digest3")
    service.analyze_dirty()  # new data: tried
    assert len(calls) == 3
    monkeypatch.undo()  # the bug fixed: the loop waits for new data, a request does not
    service.analyze_dirty()
    assert "job" in service.errors
    service.analyze("job")
    assert "job" not in service.errors and store.latest_verdict("job") is not None


def test_two_ranks_on_one_gpu_of_a_host_are_numbered_apart():
    # Two agents on one host each number their ranks' GPUs from 0; the localizer must not
    # name both ranks' faults as one device. A host without a clash keeps its numbers.
    import pandas as pd

    from holmes_ml.serve.engine import agent_summary_frames

    ranks = pd.DataFrame({"rank": [3, 1, 0, 2, 4], "host": ["a", "a", "a", "a", "b"],
                          "gpu": [1, 1, 0, 0, 5], **{c: [-1] * 5 for c in
                                                     ("dp", "pp", "tp", "cp", "ep")}})
    empty = pd.DataFrame({"rank": [], "host": [], "group": [], "group_kind": []})
    frames = agent_summary_frames({"groups": {}, "abnormal": empty, "iterations": None,
                                   "ranks": ranks})
    placed = frames["ranks"].set_index("rank")["gpu"].to_dict()
    assert placed == {0: 0, 1: 1, 2: 2, 3: 3, 4: 5}


def test_a_stored_topology_that_fails_todays_checks_is_set_aside_not_fatal(tmp_path, caplog):
    # a database from before two ranks on one GPU were refused: every verdict of the job
    # failed; it is analysed without the topology, and the log says why
    from holmes_ml.serve.engine import topology_of

    store = Store(tmp_path / "serve.db")
    store.set_topology("old", {"ranks": {"rank": list(range(4)), "host": ["h0"] * 4,
                                         "gpu": [0, 1, 0, 1], "pod": [0] * 4}, "groups": []})
    with caplog.at_level("WARNING", logger="holmes_ml.serve.engine"):
        assert topology_of(store, "old") is None
    assert "two ranks on one GPU" in caplog.text and "without it" in caplog.text


def test_a_source_that_stopped_while_the_others_went_on_is_lagging(tmp_path, monkeypatch):
    """An agent that died shows: its last delivery and newest iteration stay where they were
    (also after pruning, and in a database of a holmes_ml before the table existed)."""
    import holmes_ml.serve.store as store_module
    from holmes_ml.serve.store import LAG_SECONDS

    clock = [1000.0]
    monkeypatch.setattr(store_module.time, "time", lambda: clock[0])
    store = Store(tmp_path / "serve.db")
    ops = validate(make_ops(seed=1, iterations=40))

    def send(source: str, k: int, first: int, last: int) -> None:
        part = ops[ops["iteration"].between(first, last)]
        store.ingest_raw("job", source, f"{source}{k}", k, pa.Table.from_pandas(
            part, preserve_index=False), f"{source}-{k}")

    send("node0", 0, 0, 9)
    send("node1", 0, 0, 9)
    clock[0] += LAG_SECONDS - 1
    send("node1", 1, 10, 39)
    first = {s["source"]: s for s in store.sources("job")}
    assert first["node0"]["behind_iterations"] == 30 and not first["node0"]["lagging"]
    clock[0] += 2  # node0 silent for LAG_SECONDS + 1 while node1 went on
    send("node1", 2, 39, 39)
    got = {s["source"]: s for s in store.sources("job")}
    assert got["node0"]["lagging"] and not got["node1"]["lagging"]
    assert (got["node0"]["last_iteration"], got["node1"]["last_iteration"]) == (9, 39)
    assert got["node1"]["batches"] == 3 and got["node0"]["batches"] == 1
    assert got["node0"]["records"] == int(ops["iteration"].between(0, 9).sum())
    assert got["node0"]["last_at"] == 1000.0 and got["node1"]["first_at"] == 1000.0
    store.prune("job", 5)  # node0's only batch is pruned; its activity is not
    assert {s["source"]: s for s in store.sources("job")}["node0"]["lagging"]
    # an older database: the table is filled from the batches it kept, once, on opening
    store._db.execute("DELETE FROM source_activity")
    again = {s["source"]: s for s in Store(tmp_path / "serve.db").sources("job")}
    assert set(again) == {"node1"} and again["node1"]["batches"] == 2  # 2 kept of 3


def test_a_send_and_a_recv_of_one_step_are_two_abnormal_operators(tmp_path):
    """They share rank, communicator, seq and peer: kept as one, a third of a pipeline job's
    abnormal operators were lost and the verdict gained NIC suspects (the AR trace's)."""
    store = Store(tmp_path / "serve.db")
    body = window_batch(0, range(1), slow_rank=None)
    body["groups"].append({"name": "pp-0", "kind": "pp", "ranks": [0, 1]})
    body["abnormal"] = {"iteration": [0, 0, 0], "rank": [0, 0, 0],
                        "op": ["send", "recv", "send"], "group": ["pp-0"] * 3, "seq": [4] * 3,
                        "nbytes": [8] * 3, "start_ns": [100, 200, 300],
                        "duration_us": [5.0, 7.0, 9.0], "score": [0.9] * 3, "peer": [1] * 3}
    store.ingest_agent("job", body, "d0")
    got = store.agent_data("job")["abnormal"]
    # the send and the recv both stay; of the same send sent twice, the last one
    assert sorted(zip(got["op"], got["duration_us"], strict=True)) == [("recv", 7.0),
                                                                       ("send", 9.0)]
