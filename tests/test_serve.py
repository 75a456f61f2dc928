"""The service against a real uvicorn on 127.0.0.1: ingest, query, errors, crash safety, fuzz."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import threading

import httpx
import pytest
import test_serve_support
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve_support import TOKEN, auth, make_ops, raw_body, start_server, window_batch


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("serve"))
    yield srv
    srv.stop()


def test_raw_ingest_query_and_metrics(server):
    ops = make_ops(seed=1, slow_rank=5)
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    half = len(ops) // 2
    for i, part in enumerate((ops.iloc[:half], ops.iloc[half:])):
        r = c.post("/v1/jobs/jobA/raw", json=raw_body(part, f"b{i}", seq=i))
        assert r.status_code == 200, r.text
        assert r.json()["records"] == len(part) and not r.json()["duplicate"]
    v = c.post("/v1/jobs/jobA/analyze").json()
    assert v["version"] == 1 and not v["stale"]
    assert v["state"] == "analysed" and v["irregular"] is True, v
    assert v["candidates"][0]["ranks"] == [5]
    jobs = {j["job"]: j for j in c.get("/v1/jobs").json()}
    assert jobs["jobA"]["records"] == len(ops) and jobs["jobA"]["mode"] == "raw"
    assert jobs["jobA"]["top"]["ranks"] == [5]
    its = c.get("/v1/jobs/jobA/iterations").json()
    assert [i["iteration"] for i in its] == sorted(ops["iteration"].unique().tolist())
    assert c.get("/v1/jobs/jobA/candidates", params={"limit": 1}).json()[0]["ranks"] == [5]
    m = c.get("/metrics").text
    assert f'holmes_ingest_records_total{{mode="raw"}} {float(len(ops))}' in m
    assert 'holmes_job_top_candidate_score{device="gpu:rank5",job="jobA",kind="gpu"}' in m
    # a batch without a row is refused (it made a job of no rank)
    empty = raw_body(ops.iloc[:0], "empty", seq=None)
    r = c.post("/v1/jobs/jobEmpty/raw", json=empty)
    assert r.status_code == 422 and r.json()["field"] == "columns", r.text
    assert "no operator rows" in r.json()["detail"]
    r = c.post("/v1/jobs/jobEmpty/batches", json={"source": "s", "batch_id": "b", "seq": 1})
    assert r.status_code == 422 and "an empty batch" in r.json()["detail"], r.text
    assert "jobEmpty" not in {j["job"] for j in c.get("/v1/jobs").json()}
    # a resend is idempotent: same answer, nothing stored twice
    r = c.post("/v1/jobs/jobA/raw", json=raw_body(ops.iloc[:half], "b0", seq=0))
    assert r.status_code == 200 and r.json()["duplicate"]
    assert c.get("/v1/jobs/jobA").json()["records"] == len(ops)


def test_gzip_agent_batch_roundtrip(server):
    body = {"source": "n1", "batch_id": "n1-0", "seq": 0,
            "ranks": {"rank": [0, 1], "host": ["h0", "h0"], "gpu": [0, 1]},
            "groups": [{"name": "dp-0", "kind": "dp", "ranks": [0, 1]}],
            "iterations": {"iteration": [0, 0], "rank": [0, 1], "start_ns": [0, 5],
                           "end_ns": [100, 900], "comm_us": [0.1, 0.9], "n_ops": [3, 3]},
            "abnormal": {"iteration": [0], "rank": [1], "op": ["all_reduce"], "group": ["dp-0"],
                         "seq": [0], "nbytes": [8], "start_ns": [5], "duration_us": [0.9],
                         "score": [0.97]}}
    r = httpx.post(server.url + "/v1/jobs/jobG/batches",
                   content=gzip.compress(json.dumps(body).encode()),
                   headers={**auth(), "Content-Encoding": "gzip",
                            "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["records"] == 6
    # its latency is filed under its route (inflating the body lost the matched route: 'other')
    timed = [ln for ln in httpx.get(server.url + "/metrics").text.splitlines()
             if ln.startswith("holmes_request_seconds_count")]
    assert any('route="/v1/jobs/{job}/batches"' in ln for ln in timed), timed
    assert not any('route="other"' in ln for ln in timed), timed
    v = httpx.post(server.url + "/v1/jobs/jobG/analyze", headers=auth()).json()
    assert v["candidates"][0]["ranks"] == [1]
    # several gzip members (RFC 1952; `cat a.gz b.gz`) are one body; what follows a stream
    # and is no member, or a stream cut short, is refused saying so
    text = json.dumps(dict(body, batch_id="n1-1", seq=1)).encode()
    half = len(text) // 2
    h = {**auth(), "Content-Encoding": "gzip", "Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/jobs/jobG/batches", headers=h,
                   content=gzip.compress(text[:half]) + gzip.compress(text[half:]))
    assert r.status_code == 200, r.text
    for content, said in [(gzip.compress(text) + b"GARBAGE", "7 byte(s) after the gzip stream"),
                          (gzip.compress(text)[:-12], "cut short")]:
        r = httpx.post(server.url + "/v1/jobs/jobG/batches", headers=h, content=content)
        assert r.status_code == 400 and said in r.json()["detail"], r.text


def test_a_verdict_reads_the_most_recent_iterations_and_keeps_the_rest(server):
    """A job that has run long: the verdict reads its 200 most recent iterations (the
    service's default), so it costs what it did at the start; rank 1, abnormal in the first 100
    iterations of 300, is not blamed for what rank 0 does now. Nothing is deleted: ?last=0
    gives every iteration back."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    for seq, (its, slow) in enumerate([(range(0, 100), 1), (range(100, 250), None),
                                       (range(250, 300), 0)]):
        assert c.post("/v1/jobs/jobLong/batches", json=window_batch(seq, its, slow)
                      ).status_code == 200
    v = c.post("/v1/jobs/jobLong/analyze").json()
    assert [x["ranks"] for x in v["candidates"]] == [[0]], v
    assert v["irregular_iterations"] == list(range(250, 300))
    assert [r["iteration"] for r in c.get("/v1/jobs/jobLong/iterations").json()] == \
        list(range(100, 300))
    assert len(c.get("/v1/jobs/jobLong/iterations", params={"last": 0}).json()) == 300
    assert len(c.get("/v1/jobs/jobLong/iterations", params={"last": 5}).json()) == 5
    r = c.get("/v1/jobs/jobLong/iterations", params={"last": -1})
    assert r.status_code == 422 and r.json()["field"] == "last", r.text
    # raw records alike: the batches of old iterations are not even read
    ops = make_ops(seed=6, iterations=260, slow_rank=5)
    old = ops["iteration"] < 60
    ops.loc[old & (ops["rank"] == 5), "duration_us"] /= 10  # rank 5 slow only after 60
    ops.loc[old & (ops["rank"] == 2), "duration_us"] *= 100  # rank 2 slower, before
    for seq, part in enumerate((ops[old], ops[~old])):
        assert c.post("/v1/jobs/jobLongRaw/raw", json=raw_body(part, f"r{seq}", seq=seq)
                      ).status_code == 200
    v = c.post("/v1/jobs/jobLongRaw/analyze").json()
    assert v["candidates"] and v["candidates"][0]["ranks"] == [5], json.dumps(v)[:1500]
    assert min(v["irregular_iterations"]) >= 60, v


def _slowing_batch(seq: int, iterations: range, slow_from: int) -> dict:
    """Two ranks' summaries of ``iterations`` back to back (each step is its span): about 1 ms
    each, 1.3 ms from ``slow_from`` on (the job as a whole slowed down)."""
    its, start, end, t = [], [], [], 0
    for i in iterations:
        dur = (1_300_000 if i >= slow_from else 1_000_000) + 5_000 * (i % 3)
        its += [i, i]
        start += [t, t + 1_000]
        end += [t + dur, t + dur]
        t += dur + 10_000
    body = {"source": "n1", "batch_id": f"s-{seq}", "seq": seq,
            "iterations": {"iteration": its, "rank": [0, 1] * len(iterations),
                           "start_ns": start, "end_ns": end, "comm_us": [0.5] * len(its),
                           "n_ops": [3] * len(its)}}
    if seq == 0:
        body["ranks"] = {"rank": [0, 1], "host": ["h0", "h0"], "gpu": [0, 1]}
        body["groups"] = [{"name": "dp-0", "kind": "dp", "ranks": [0, 1]}]
    return body


def test_the_last_iterations_are_judged_against_the_iterations_before_them(server):
    """``?last=N`` only limits the rows returned: a job whose 10 latest iterations are all slow
    shows them irregular with ?last=10 too (the monitor was run on those 10 alone, with no
    reference before them: all regular, ratio 1.0), the same rows as the default answer's
    last 10; a longer ?last is judged over the iterations it reads."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    assert c.post("/v1/jobs/jobTail/batches", json=_slowing_batch(0, range(0, 30), 20)
                  ).status_code == 200
    url = "/v1/jobs/jobTail/iterations"
    full = c.get(url).json()
    assert [r["iteration"] for r in full if r["irregular"]] == list(range(20, 30)), full
    assert all(1.25 < r["ratio"] < 1.35 for r in full[20:]), full[20:]
    for n in (10, 3, 25, 30):
        assert c.get(url, params={"last": n}).json() == full[-n:], n
    assert c.get(url, params={"last": 4, "irregular_only": True}).json() == full[-4:]
    # a job longer than the verdict's window (200 iterations): the rows of ?last=10 are those
    # of the default answer, of ?last=250 and of ?last=0 (every iteration) judged alike
    assert c.post("/v1/jobs/jobTailLong/batches", json=_slowing_batch(0, range(0, 300), 290)
                  ).status_code == 200
    url = "/v1/jobs/jobTailLong/iterations"
    window = c.get(url).json()
    assert [r["iteration"] for r in window] == list(range(100, 300))
    assert [r["iteration"] for r in window if r["irregular"]] == list(range(290, 300))
    assert c.get(url, params={"last": 10}).json() == window[-10:]
    for n in (250, 0):
        tail = c.get(url, params={"last": n}).json()
        assert len(tail) == (n or 300)
        assert [r["iteration"] for r in tail if r["irregular"]] == list(range(290, 300)), n
    # raw records alike: the iterations after 20 of this job take 1.3x as long
    ops = make_ops(seed=8, iterations=30, slow_rank=5)
    late = (ops["iteration"] >= 20).to_numpy()
    ops.loc[late, "start_ns"] = (ops["iteration"] * 10_000_000
                                 + ops["seq"] % 100 * 1_300_000)[late]
    assert c.post("/v1/jobs/jobTailRaw/raw", json=raw_body(ops, "t0", seq=0)).status_code == 200
    url = "/v1/jobs/jobTailRaw/iterations"
    full = c.get(url).json()
    assert [r["iteration"] for r in full if r["irregular"]] == list(range(20, 30)), full
    assert c.get(url, params={"last": 10}).json() == full[-10:]


def _agent_batch(source: str, seq: int, ranks: list[int], host: str, group: list[int],
                 iteration: int = 0, kind: str = "dp") -> dict:
    n = len(ranks)
    return {"source": source, "batch_id": f"{source}-{seq}", "seq": seq,
            "ranks": {"rank": ranks, "host": [host] * n, "gpu": list(range(n))},
            "groups": [{"name": "dp-0", "kind": kind, "ranks": group}],
            "iterations": {"iteration": [iteration] * n, "rank": ranks,
                           "start_ns": [0] * n, "end_ns": [100] * n, "comm_us": [0.1] * n,
                           "n_ops": [3] * n}}


def test_a_rank_sent_by_two_agents_is_refused_and_nothing_accepted_is_lost(server):
    """A second agent following the same logs would overwrite the first one's rows (they are
    keyed by rank and iteration): its batch is refused with 409 naming the rank and both
    sources, and the job keeps what it had. Agents that each saw part of a communicator
    (logs without its member list) add up to the whole of it."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    r = c.post("/v1/jobs/jobO/batches", json=_agent_batch("n1", 0, [0, 1], "h1", [0, 1]))
    assert r.status_code == 200, r.text
    r = c.post("/v1/jobs/jobO/batches", json=_agent_batch("n2", 0, [2, 3], "h2", [2, 3]))
    assert r.status_code == 200, r.text
    before = c.get("/v1/jobs/jobO").json()
    clash = _agent_batch("n3", 0, [1, 2, 9], "h3", [1, 2, 9])
    r = c.post("/v1/jobs/jobO/batches", json=clash)
    assert r.status_code == 409 and r.json()["field"] == "ranks", r.text
    detail = r.json()["detail"]
    assert "the agent sending rank 1 of job 'jobO': 'n1' since batch 'n1-0' of source 'n1'; " \
           "batch 'n3-0' of source 'n3' says 'n3' (and 1 more in this batch)" in detail, detail
    after = c.get("/v1/jobs/jobO").json()
    assert (after["records"], after["batches"]) == (before["records"], before["batches"])
    # a later batch of the first agent still lands; rank 9 was not taken by the refused one
    assert c.post("/v1/jobs/jobO/batches",
                  json=_agent_batch("n1", 1, [0, 1], "h1", [0, 1], 1)).status_code == 200
    assert c.post("/v1/jobs/jobO/batches",
                  json=_agent_batch("n3", 1, [9], "h3", [9], 1)).status_code == 200
    with sqlite3.connect(f"file:{server.db}?mode=ro", uri=True) as db:
        members = db.execute("SELECT ranks FROM groups WHERE job='jobO' AND name='dp-0'")
        assert members.fetchone()[0] == "0 1 2 3 9"


def test_agents_disagreeing_on_a_communicators_kind_are_refused(server):
    """Member lists of a communicator add up across agents; its kind is one: an agent calling
    it otherwise gets 409 naming the communicator, both kinds and ``groups.kind``, and the
    stored kind stays."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    assert c.post("/v1/jobs/jobK/batches",
                  json=_agent_batch("n1", 0, [0, 1], "h1", [0, 1])).status_code == 200
    r = c.post("/v1/jobs/jobK/batches", json=_agent_batch("n2", 0, [2, 3], "h2", [2, 3],
                                                          kind="tp"))
    assert r.status_code == 409 and r.json()["field"] == "groups.kind", r.text
    assert "the kind of communicator 'dp-0' of job 'jobK': 'dp' since batch 'n1-0' of source " \
           "'n1'; batch 'n2-0' of source 'n2' says 'tp'" in r.json()["detail"], r.text
    assert c.post("/v1/jobs/jobK/batches",
                  json=_agent_batch("n2", 0, [2, 3], "h2", [2, 3])).status_code == 200
    with sqlite3.connect(f"file:{server.db}?mode=ro", uri=True) as db:
        row = db.execute("SELECT kind, ranks FROM groups WHERE job='jobK' AND name='dp-0'")
        assert row.fetchone() == ("dp", "0 1 2 3")


def test_raw_batches_that_contradict_earlier_ones_are_refused(server):
    """Raw records carry each rank's host and each communicator's members and kind: a batch
    saying otherwise than an accepted one is refused (409 naming both batches), not read as if
    it agreed; members in another order agree."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    ops = make_ops(seed=5, iterations=4)
    cols = ["host", "group_ranks", "group_kind"]

    def body(part, batch_id, source="logger"):
        b = raw_body(part, batch_id, source=source)
        b["columns"].update({k: part[k].tolist() for k in cols})
        return b

    assert c.post("/v1/jobs/jobF/raw", json=body(ops[ops["iteration"] == 0], "b0")).status_code \
        == 200
    before = c.get("/v1/jobs/jobF").json()
    moved = ops[ops["iteration"] == 1].assign(host=lambda d: d["host"].where(d["rank"] != 5, "h9"))
    r = c.post("/v1/jobs/jobF/raw", json=body(moved, "b1", source="other"))
    assert r.status_code == 409 and r.json()["field"] == "host", r.text
    assert "the host of rank 5 of job 'jobF': 'h1' since batch 'b0' of source 'logger'; batch " \
           "'b1' of source 'other' says 'h9'" in r.json()["detail"], r.text
    one = ops[ops["iteration"] == 1]
    renamed = one[one["rank"] != 7].assign(group_ranks="0 1 2 3 4 5 6 9")
    r = c.post("/v1/jobs/jobF/raw", json=body(renamed, "b2"))
    assert r.status_code == 409 and r.json()["field"] == "group_ranks", r.text
    assert "the members of communicator 'dp-0' of job 'jobF': '0 1 2 3 4 5 6 7'" \
        in r.json()["detail"], r.text
    assert c.get("/v1/jobs/jobF").json()["records"] == before["records"]
    shuffled = ops[ops["iteration"] == 1].assign(group_ranks="7 6 5 4 3 2 1 0")
    assert c.post("/v1/jobs/jobF/raw", json=body(shuffled, "b3")).status_code == 200
    # Arrow records naming a job (the logger writes a job column): one per service job
    import pyarrow as pa

    def arrow(job, batch_id):
        t = pa.Table.from_pandas(ops[ops["iteration"] == 2].assign(job=job),
                                 preserve_index=False)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        return c.post("/v1/jobs/jobF/raw.arrow", content=sink.getvalue().to_pybytes(),
                      params={"source": "logger", "batch_id": batch_id},
                      headers={"Content-Type": "application/vnd.apache.arrow.stream"})

    assert arrow("pretrain", "b4").status_code == 200
    r = arrow("eval", "b5")
    assert r.status_code == 409 and r.json()["field"] == "job", r.text
    assert "the job named in the records of job 'jobF': 'pretrain' since batch 'b4' of " \
        "source 'logger'; batch 'b5' of source 'logger' says 'eval'" in r.json()["detail"], r.text
    assert arrow("pretrain", "b6").status_code == 200


@pytest.mark.parametrize(
    ("mutate", "status", "needle"),
    [
        (lambda b: b["columns"].update(rank=["x"] * len(b["columns"]["rank"])), 422, "rank"),
        (lambda b: b["columns"]["seq"].pop(), 422, "seq"),
        (lambda b: b["columns"].update(op=["allreduce!"] * len(b["columns"]["op"])), 422, "op"),
        (lambda b: b.update(batch_id="../etc"), 422, "batch_id"),
        (lambda b: b.update(extra=1), 422, "extra"),
        (lambda b: b["columns"].update(duration_us=[-1.0] * len(b["columns"]["rank"])), 422,
         "duration_us"),
        (lambda b: b["columns"].update(group_ranks=["0 1 x"] * len(b["columns"]["rank"])), 422,
         "not a list of ranks"),
        # a number must be a JSON number of the API's type: nothing is guessed
        (lambda b: b["columns"].update(rank=[str(r) for r in b["columns"]["rank"]]), 422,
         "body.columns.rank.0: Input should be a valid integer"),
        (lambda b: b["columns"].update(nbytes=[n + 0.5 for n in b["columns"]["nbytes"]]), 422,
         "body.columns.nbytes.0: Input should be a valid integer"),
        (lambda b: b.update(seq=True), 422, "body.seq: Input should be a valid integer"),
    ],
)
def test_bad_bodies_get_4xx_naming_the_field(server, mutate, status, needle):
    body = raw_body(make_ops(seed=2, iterations=2), "bad")
    mutate(body)
    r = httpx.post(server.url + "/v1/jobs/jobBad/raw", json=body, headers=auth())
    assert r.status_code == status, r.text
    assert needle in r.text


def test_a_key_named_twice_in_one_object_is_refused_naming_it(server):
    """Which copy of a repeated key counts is up to the parser; the service refuses the body
    instead of picking one, and keeps what it had."""
    c = httpx.Client(base_url=server.url, headers={**auth(), "Content-Type": "application/json"},
                     timeout=30)
    ok = raw_body(make_ops(seed=2, iterations=2), "keys-ok", seq=1)
    assert c.post("/v1/jobs/jobKeys/raw", json=ok).status_code == 200
    body = json.dumps(raw_body(make_ops(seed=2, iterations=2), "keys-twice", seq=2))
    twice = body.replace('"rank": [', '"rank": [], "rank": [', 1)
    r = c.post("/v1/jobs/jobKeys/raw", content=twice.encode())
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "body"
    assert r.json()["detail"].startswith("body: key 'rank' appears 2 times in one object (keys: "
                                         "iteration, rank, op,"), r.text
    r = c.post("/v1/jobs/jobKeys/raw", content=body[:-40].encode())
    assert r.status_code == 422 and "not valid JSON: " in r.json()["detail"], r.text
    assert r.json()["detail"].endswith(f"at character {len(body) - 40}"), r.text
    r = c.post("/v1/jobs/jobKeys/raw", content=b'{"source": "\xff"}')
    assert r.status_code == 422 and r.json()["detail"].startswith("body: not UTF-8 text"), r.text
    assert c.get("/v1/jobs/jobKeys").json()["records"] == len(ok["columns"]["rank"])
    assert c.post("/v1/jobs/jobKeys/raw", content=body.encode()).status_code == 200


def _rejected(c: httpx.Client, status: int) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(f'holmes_requests_rejected_total{{status="{status}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_body_with_infinity_gets_422_naming_the_field_and_counts_once(server):
    """Python's JSON parser takes Infinity; echoing it back in FastAPI's default 422 body
    failed (a 500). Now: one line naming the field, the field, each error without its value;
    and a refusal is counted once in holmes_requests_rejected_total, whatever refused it."""
    c = httpx.Client(base_url=server.url, headers={**auth(), "Content-Type": "application/json"},
                     timeout=30)
    body = raw_body(make_ops(seed=2, iterations=2), "inf")
    body["columns"]["duration_us"][3] = float("inf")
    before = _rejected(c, 422)
    r = c.post("/v1/jobs/jobInf/raw", content=json.dumps(body).encode())
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "columns.duration_us", r.text
    assert r.json()["detail"].startswith("body.columns.duration_us.3: "), r.text
    assert all(set(e) == {"loc", "msg", "type"} for e in r.json()["errors"]), r.text
    assert _rejected(c, 422) == before + 1
    before = _rejected(c, 409)
    ok = raw_body(make_ops(seed=2, iterations=2), "dup", seq=3)
    assert c.post("/v1/jobs/jobInf/raw", content=json.dumps(ok).encode()).status_code == 200
    older = raw_body(make_ops(seed=2, iterations=2), "dup2", seq=1)
    assert c.post("/v1/jobs/jobInf/raw", content=json.dumps(older).encode()).status_code == 409
    assert _rejected(c, 409) == before + 1


@pytest.mark.parametrize("sent", ["text/plain", "application/x-www-form-urlencoded", None,
                                  "text/json"])
def test_json_not_labelled_json_is_told_to_say_so(server, sent):
    # `curl -d @body.json` labels it a form: valid JSON was refused as "not a valid dictionary"
    headers = {**auth(), **({"Content-Type": sent} if sent else {})}
    raw = json.dumps(raw_body(make_ops(seed=4, iterations=2), "label", seq=1)).encode()
    topo = json.dumps({"ranks": {"rank": [0], "host": ["a"], "gpu": [0], "pod": [0]}}).encode()
    for method, path, body in (("POST", "/v1/jobs/jobL/raw", raw),
                               ("PUT", "/v1/jobs/jobL/topology", topo)):
        r = httpx.request(method, server.url + path, content=body, headers=headers)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "content-type", r.text
        assert "expected Content-Type: application/json" in r.json()["detail"]
        assert (repr(sent) if sent else "without a Content-Type") in r.json()["detail"]


@pytest.mark.parametrize("sent", ["application/json", None])
def test_an_empty_body_is_called_empty(server, sent):
    headers = {**auth(), **({"Content-Type": sent} if sent else {})}
    r = httpx.put(server.url + "/v1/jobs/jobE/topology", content=b"", headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == "body: empty; expected a JSON object", r.text


def test_protocol_errors(server):
    u = server.url
    ok = raw_body(make_ops(seed=3, iterations=2), "p0", seq=5)
    assert httpx.post(u + "/v1/jobs/jobP/raw", json=ok).status_code == 401
    assert httpx.post(u + "/v1/jobs/jobP/raw", json=ok,
                      headers=auth("wrong")).status_code == 401
    r = httpx.post(u + "/v1/jobs/jobP/raw", content=b"{not json", headers=auth())
    assert r.status_code == 422
    assert httpx.post(u + "/v1/jobs/jobP/raw", json=ok, headers=auth()).status_code == 200
    older = raw_body(make_ops(seed=3, iterations=2), "p1", seq=4)
    r = httpx.post(u + "/v1/jobs/jobP/raw", json=older, headers=auth())
    assert r.status_code == 409 and r.json()["field"] == "seq"
    changed = raw_body(make_ops(seed=4, iterations=2), "p0", seq=5)
    r = httpx.post(u + "/v1/jobs/jobP/raw", json=changed, headers=auth())
    assert r.status_code == 409 and r.json()["field"] == "batch_id"
    r = httpx.post(u + "/v1/jobs/jobP/raw", content=b"x" * (5 * 2**20),
                   headers={**auth(), "Content-Type": "application/json"})
    assert r.status_code == 413
    r = httpx.get(u + "/v1/jobs/nope/verdict")
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    # every refusal is {detail, field}: an unknown route or method too
    r = httpx.get(u + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["field"] == "path", r.text
    assert "no route /v1/nothing-here" in r.json()["detail"]
    r = httpx.put(u + "/v1/jobs/jobP/raw", json=ok, headers=auth())
    assert r.status_code == 405 and r.json() == {
        "detail": "PUT not allowed on /v1/jobs/jobP/raw", "field": "method"}, r.text
    # the same without a token: what is wrong is the method or the path, not the token
    r = httpx.patch(u + "/v1/jobs/jobP", json=ok)
    assert r.status_code == 405 and r.json()["field"] == "method", r.text
    r = httpx.post(u + "/metrics", content=b"x")
    assert r.status_code == 405 and r.json()["field"] == "method", r.text
    r = httpx.post(u + "/v1/nothing-here", content=b"x" * 100)
    assert r.status_code == 404 and r.json()["field"] == "path", r.text
    # the token without its scheme is not the token
    r = httpx.post(u + "/v1/jobs/jobP/raw", json=ok, headers={"Authorization": TOKEN})
    assert r.status_code == 401 and r.json()["field"] == "authorization", r.text
    # asked before the body is read: a gzip body without the token is not even inflated
    r = httpx.post(u + "/v1/jobs/jobP/raw", content=b"not gzip at all",
                   headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 401 and r.json() == {
        "detail": "Authorization: expected 'Bearer <token>' with the service token",
        "field": "authorization"}, r.text
    deep = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(u + "/v1/jobs/jobP/raw", content=deep,
                   headers={**auth(), "Content-Type": "application/json"})
    assert r.status_code == 422 and "nested too deeply" in r.json()["detail"], r.text
    # JSON records naming another job, as Arrow ones: 409
    other = raw_body(make_ops(seed=3, iterations=2), "p9", seq=9)
    other["columns"]["job"] = ["train-b"] * len(other["columns"]["rank"])
    assert httpx.post(u + "/v1/jobs/jobJ/raw", json={
        **other, "columns": {**other["columns"], "job": ["train-a"] * len(other["columns"]["rank"])}},
        headers=auth()).status_code == 200
    r = httpx.post(u + "/v1/jobs/jobJ/raw", json={**other, "batch_id": "p10", "seq": 10},
                   headers=auth())
    assert r.status_code == 409 and r.json()["field"] == "job", r.text
    assert httpx.get(u + "/v1/jobs/jobP").json()["records"] == len(ok["columns"]["rank"])


def test_refuses_remote_bind_without_token(tmp_path):
    from holmes_ml.serve.app import ServeSettings

    with pytest.raises(ValueError, match="--token"):
        ServeSettings(db=tmp_path / "x.db", host="0.0.0.0").check()
    ServeSettings(db=tmp_path / "x.db", host="0.0.0.0", token="t").check()


def test_kill9_mid_ingest_keeps_every_acknowledged_batch(tmp_path):
    ops = make_ops(seed=7, ranks=8, iterations=40, slow_rank=3)
    parts = [ops[ops["iteration"] == i] for i in range(40)]
    srv = start_server(tmp_path)
    acked: list[int] = []
    stop = threading.Event()

    def feed(url: str) -> None:
        with httpx.Client(base_url=url, headers=auth(), timeout=5) as c:
            for i, part in enumerate(parts):
                if stop.is_set():
                    return
                try:
                    r = c.post("/v1/jobs/crash/raw", json=raw_body(part, f"it{i}", seq=i))
                except httpx.HTTPError:
                    return
                if r.status_code == 200:
                    acked.append(i)

    t = threading.Thread(target=feed, args=(srv.url,))
    t.start()
    while len(acked) < 10:
        t.join(0.01)
    srv.kill9()
    t.join()
    assert 10 <= len(acked) < 40
    srv2 = start_server(tmp_path, db=srv.db)
    try:
        c = httpx.Client(base_url=srv2.url, headers=auth(), timeout=30)
        kept = c.get("/v1/jobs/crash").json()["records"]
        acked_rows = sum(len(parts[i]) for i in acked)
        # every acknowledged batch survived; the feeder sends one batch at a time, so the one in
        # flight at the kill may be stored too (committed before its acknowledgement got out)
        assert kept in (acked_rows, acked_rows + len(parts[max(acked) + 1])), (kept, acked_rows)
        for i, part in enumerate(parts):  # the feeder resends everything: duplicates are no-ops
            r = c.post("/v1/jobs/crash/raw", json=raw_body(part, f"it{i}", seq=i))
            assert r.status_code in (200, 409), r.text
            assert r.status_code == 200 or i < max(acked)
        after = c.post("/v1/jobs/crash/analyze").json()
    finally:
        srv2.stop()
    ref = start_server(tmp_path / "ref" if (tmp_path / "ref").mkdir() is None else tmp_path)
    try:
        c = httpx.Client(base_url=ref.url, headers=auth(), timeout=30)
        for i, part in enumerate(parts):
            assert c.post("/v1/jobs/crash/raw", json=raw_body(part, f"it{i}", seq=i)).is_success
        expected = c.post("/v1/jobs/crash/analyze").json()
    finally:
        ref.stop()
    assert after["candidates"] == expected["candidates"]
    assert after["candidates"][0]["ranks"] == [3]


def _json_values():
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(), st.text(max_size=20))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
        max_leaves=20)


def _from_schema(schema: dict, spec: dict, depth: int = 0):
    """A hypothesis strategy for (mostly) schema-shaped JSON, with random deviations."""
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if depth > 4:
        return _json_values()
    if "anyOf" in schema:
        return st.one_of(*[_from_schema(s, spec, depth + 1) for s in schema["anyOf"]])
    t = schema.get("type")
    if t == "object" and "properties" in schema:
        props = {k: _from_schema(v, spec, depth + 1) for k, v in schema["properties"].items()}
        return st.fixed_dictionaries(
            {k: v for k, v in props.items() if k in schema.get("required", [])},
            optional={k: v for k, v in props.items() if k not in schema.get("required", [])})
    if t == "array":
        return st.lists(_from_schema(schema.get("items", {}), spec, depth + 1), max_size=3)
    if t == "integer":
        return st.integers(-5, 2**64)
    if t == "number":
        return st.floats()  # NaN and Infinity too: Python's JSON parser takes them
    if t == "string":
        if "enum" in schema:
            return st.sampled_from(schema["enum"]) | st.text(max_size=5)
        return st.from_regex(r"[A-Za-z0-9]{1,8}", fullmatch=True) | st.text(max_size=8)
    return _json_values()


def test_fuzz_from_openapi_never_5xx(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    ops = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            ops.append((path, method, body.get("schema")))
    names = st.sampled_from(["jobA", "fz", "x" * 129, "a/b", "..", "%00", "j-1"])
    client = httpx.Client(base_url=server.url, timeout=30)

    # HOLMES_FUZZ_EXAMPLES=N: N random (not derandomized) requests instead of the seeded 150
    examples = int(os.environ.get("HOLMES_FUZZ_EXAMPLES", "0"))

    @settings(max_examples=examples or 150, deadline=None, derandomize=not examples,
              database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data):
        path, method, schema = data.draw(st.sampled_from(ops))
        url = path.replace("{job}", data.draw(names))
        kwargs: dict = {"headers": auth() if data.draw(st.booleans()) else {}}
        if schema is not None:
            payload = data.draw(_from_schema(schema, spec) | _json_values())
            kwargs["content"] = json.dumps(payload).encode()
            kwargs["headers"]["Content-Type"] = "application/json"
        if method == "get":
            kwargs["params"] = data.draw(st.dictionaries(
                st.sampled_from(["limit", "irregular_only"]), st.text(max_size=6), max_size=2))
        r = client.request(method.upper(), url, **kwargs)
        assert r.status_code < 500, (method, url, r.text)

    check()
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert httpx.head(server.url + "/healthz").status_code == 200  # a load balancer's probe


def test_the_openapi_schema_builds_without_a_warning(tmp_path):
    # GET and HEAD /healthz as one route gave one operation id twice: FastAPI's warning in
    # the service's log at the first look at /docs
    import warnings

    from holmes_ml.serve.app import ServeSettings, create_app

    app = create_app(ServeSettings(db=tmp_path / "s.db"), analyzers=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = app.openapi()
    assert "get" in spec["paths"]["/healthz"] and "head" not in spec["paths"]["/healthz"]


def test_token_constant_is_used():
    assert TOKEN and auth()["Authorization"].endswith(TOKEN)


def test_arrow_ingest_fast_path(server):
    import pyarrow as pa

    ops = make_ops(seed=9, iterations=3)
    table = pa.Table.from_pandas(ops, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    h = {**auth(), "Content-Type": "application/vnd.apache.arrow.stream"}
    q = {"source": "lg", "batch_id": "a0", "seq": 0}
    r = httpx.post(server.url + "/v1/jobs/jobArrow/raw.arrow", content=sink.getvalue().to_pybytes(),
                   params=q, headers=h)
    assert r.status_code == 200 and r.json()["records"] == len(ops), r.text
    r = httpx.post(server.url + "/v1/jobs/jobArrow/raw.arrow", content=b"garbage",
                   params={**q, "batch_id": "a1", "seq": 1}, headers=h)
    assert r.status_code == 422 and r.json()["field"] == "body"
    bad = pa.Table.from_pandas(ops.drop(columns=["seq"]), preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, bad.schema) as w:
        w.write_table(bad)
    r = httpx.post(server.url + "/v1/jobs/jobArrow/raw.arrow", content=sink.getvalue().to_pybytes(),
                   params={**q, "batch_id": "a2", "seq": 2}, headers=h)
    assert r.status_code == 422 and "seq" in r.json()["detail"]
    # columns of another Arrow type than the API says, with or without pandas metadata that
    # claims otherwise: 422 naming the column, never a 500
    n = table.num_rows
    for k, (column, array) in enumerate([("op", pa.array([["x"]] * n)),
                                         ("host", pa.array([{"a": 1}] * n)),
                                         ("group", pa.array([b"\xff"] * n))]):
        for t in (table, table.replace_schema_metadata(None)):
            odd = t.set_column(t.column_names.index(column), column, array)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, odd.schema) as w:
                w.write_table(odd)
            r = httpx.post(server.url + "/v1/jobs/jobArrow/raw.arrow",
                           content=sink.getvalue().to_pybytes(),
                           params={**q, "batch_id": f"b{k}", "seq": 3}, headers=h)
            assert r.status_code == 422 and r.json()["field"] == f"columns.{column}", r.text
            assert "not a string" in r.json()["detail"], r.text
    # a column the API does not have is refused as on the JSON route: stored unchecked, one
    # typed otherwise by a later batch made the job unreadable (every verdict an error)
    for k, values in enumerate((pa.array([1] * n), pa.array(["x"] * n))):
        odd = table.append_column("note", values)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, odd.schema) as w:
            w.write_table(odd)
        r = httpx.post(server.url + "/v1/jobs/jobArrow/raw.arrow",
                       content=sink.getvalue().to_pybytes(),
                       params={**q, "batch_id": f"n{k}", "seq": 4 + k}, headers=h)
        assert r.status_code == 422 and r.json()["field"] == "columns.note", r.text
    assert httpx.get(server.url + "/v1/jobs/jobArrow").json()["records"] == len(ops)
    assert httpx.post(server.url + "/v1/jobs/jobArrow/analyze", headers=auth()).json()[
        "error"] is None


@pytest.mark.parametrize(("column", "values", "expected"), [
    ("rank", ["1e3"], "an Arrow integer type"),  # was stored as rank 1000
    ("rank", [" 7 "], "an Arrow integer type"),
    ("duration_us", ["5"], "an Arrow floating-point or integer type"),
    ("seq", [b"1"], "an Arrow integer type"),
    ("nbytes", [True], "an Arrow integer type"),
    ("start_ns", [[1]], "an Arrow integer type"),
])
def test_arrow_ingest_refuses_text_where_a_number_is_expected(server, column, values,
                                                               expected):
    """A string column of the Arrow stream where the schema holds a number was read by
    pandas as one (rank "1e3" stored as rank 1000, " 7 " as 7, duration_us "5" as 5): 200,
    while the JSON route refuses "seq": "1". It is refused with 422 naming the column, its
    Arrow type and the type expected, and nothing is stored."""
    import pyarrow as pa

    ops = make_ops(seed=10, ranks=1, iterations=1, ops_per_iter=1)
    table = pa.Table.from_pandas(ops, preserve_index=False)
    odd = table.set_column(table.column_names.index(column), column, pa.array(values))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, odd.schema) as w:
        w.write_table(odd)
    r = httpx.post(server.url + "/v1/jobs/jobArrowText/raw.arrow",
                   content=sink.getvalue().to_pybytes(),
                   params={"source": "lg", "batch_id": "t0"},
                   headers={**auth(), "Content-Type": "application/vnd.apache.arrow.stream"})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == f"columns.{column}", r.text
    kind = odd.schema.field(column).type
    assert r.json()["detail"].startswith(
        f"body: column {column!r} is of Arrow type {kind}, not a number; expected {expected}"
    ), r.text
    assert httpx.get(server.url + "/v1/jobs/jobArrowText").status_code == 404


def test_openapi_lists_the_statuses_each_route_answers(server):
    """/openapi.json (and /docs) listed only 200 and 422 for every route, though the service
    answers 400, 401, 404, 409, 413, 415 and 503 too: a client generated from it knew none of
    them. Each route lists those it can answer, as the service's {detail, field} body."""
    spec = httpx.get(server.url + "/openapi.json").json()

    def statuses(path: str, method: str) -> set[str]:
        return set(spec["paths"][path][method]["responses"])

    assert statuses("/v1/jobs/{job}/batches", "post") == {
        "200", "400", "401", "409", "413", "415", "422", "503"}
    assert statuses("/v1/jobs/{job}/raw.arrow", "post") == statuses(
        "/v1/jobs/{job}/batches", "post")
    assert statuses("/v1/jobs/{job}", "get") == {"200", "404", "422", "503"}
    assert statuses("/v1/jobs/{job}", "delete") >= {"401", "404"}
    assert statuses("/v1/jobs", "get") == {"200", "503"}
    conflict = spec["paths"]["/v1/jobs/{job}/batches"]["post"]["responses"]["409"]
    assert "seq" in conflict["description"]
    ref = conflict["content"]["application/json"]["schema"]["$ref"]
    error = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(error["required"]) == {"detail", "field"}
    # what the service answers is what the schema says
    r = httpx.get(server.url + "/v1/jobs/no-such-job")
    assert r.status_code == 404 and set(r.json()) == {"detail", "field"}


@pytest.mark.parametrize("mutate, needle", [
    # one rank's operators in one iteration: beyond any job, and summed over batches the
    # job's record count would outgrow 64 bits (GET /v1/jobs then failed for every job)
    (lambda b: b["iterations"].update(n_ops=[2**63 - 1, 1]),
     "body.iterations.n_ops.0: Input should be less than or equal to 2147483647"),
    (lambda b: b["iterations"].update(start_ns=[0, 50], end_ns=[100, 40]),
     "row 1: end_ns 40 before start_ns 50"),
    (lambda b: b["iterations"].update(start_ns=[200, 0]),
     "row 0: end_ns 100 before start_ns 200"),
    (lambda b: b["iterations"].update(comm_us=[1e308, 0.1]),
     "body.iterations.comm_us.0: Input should be less than or equal to 9200000000000000"),
    (lambda b: b.update(abnormal={
        "iteration": [0], "rank": [1], "op": ["all_reduce"], "group": ["dp-0"], "seq": [0],
        "nbytes": [8], "start_ns": [2**63 - 10], "duration_us": [1.0], "score": [0.9]}),
     "row 0: start_ns 9223372036854775798 + duration_us 1.0 ends beyond 2**63 ns"),
])
def test_agent_summaries_that_would_break_later_verdicts_are_refused(server, mutate, needle):
    """Values the old schema let through and that broke the job afterwards (a negative or
    overflowing record count, an iteration ending before it starts, an op ending beyond 64-bit
    ns): refused with 422 naming them, and the job keeps what it had."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    good = _agent_batch("n1", 0, [0, 1], "h1", [0, 1])
    if c.get("/v1/jobs/jobPoison").status_code == 404:
        assert c.post("/v1/jobs/jobPoison/batches", json=good).status_code == 200
    before = c.get("/v1/jobs/jobPoison").json()
    bad = _agent_batch("n1", 1, [0, 1], "h1", [0, 1], iteration=1)
    mutate(bad)
    r = c.post("/v1/jobs/jobPoison/batches", json=bad)
    assert r.status_code == 422 and needle in r.json()["detail"], r.text
    after = c.get("/v1/jobs/jobPoison").json()
    assert (after["records"], after["batches"]) == (before["records"], before["batches"])
    assert c.get("/v1/jobs").status_code == 200


def test_a_raw_duration_ending_beyond_64_bit_ns_is_refused(server):
    body = raw_body(make_ops(seed=2, iterations=2), "huge-dur")
    body["columns"]["duration_us"][3] = 1e15
    body["columns"]["start_ns"][3] = 2**63 - 10**17
    r = httpx.post(server.url + "/v1/jobs/jobHuge/raw", json=body, headers=auth())
    assert r.status_code == 422 and "row 3: start_ns" in r.json()["detail"], r.text


@pytest.mark.parametrize("mutate, needle", [
    (lambda b: b["ranks"].update(rank=[0, 0], host=["h1", "h2"]),
     "row 1: rank 0 again (as in row 0); expected each rank once"),
    (lambda b: b["ranks"].update(gpu=[3, 3]),
     "row 1: (host, gpu) ('h1', 3) again (as in row 0); expected one rank per GPU of a host"),
    (lambda b: b["ranks"].update(host=["h1", ""]),
     "body.ranks.host.1: String should have at least 1 character"),
    (lambda b: b["groups"][0].update(ranks=[0, 1, 0]),
     "row 2: rank 0 again (as in row 0); expected each member once"),
])
def test_an_agent_batch_placing_ranks_twice_is_refused(server, mutate, needle):
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    bad = _agent_batch("n1", 0, [0, 1], "h1", [0, 1])
    mutate(bad)
    r = c.post("/v1/jobs/jobTwice/batches", json=bad)
    assert r.status_code == 422 and needle in r.json()["detail"], r.text


def test_an_agent_moving_its_rank_to_another_host_is_refused(server):
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    assert c.post("/v1/jobs/jobMove/batches",
                  json=_agent_batch("n1", 0, [0, 1], "h1", [0, 1])).status_code == 200
    r = c.post("/v1/jobs/jobMove/batches", json=_agent_batch("n1", 1, [0], "h2", [0, 1], 1))
    assert r.status_code == 409 and r.json()["field"] == "ranks.host", r.text
    assert "the host of rank 0 of job 'jobMove': 'h1'" in r.json()["detail"], r.text
    assert c.get("/v1/jobs/jobMove").json()["batches"] == 1


def test_an_iteration_resent_with_fewer_operators_is_no_server_error(server):
    # the net records of such a batch are negative: the ingest counter refused the step (a 500
    # after the batch was stored, and then a 200 "duplicate" on the agent's retry)
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    for seq, n_ops in ((1, 7), (2, 2)):
        body = {"source": "a", "batch_id": f"b{seq}", "seq": seq,
                "iterations": {"iteration": [0], "rank": [0], "start_ns": [1000],
                               "end_ns": [2000], "comm_us": [1.0], "n_ops": [n_ops]}}
        r = c.post("/v1/jobs/jobFewer/batches", json=body)
        assert r.status_code == 200 and not r.json()["duplicate"], r.text
    assert c.get("/v1/jobs/jobFewer").json()["records"] == 2
    m = c.get("/metrics").text
    assert "holmes_ingest_records_total" in m and "-" not in [
        ln.split()[-1][0] for ln in m.splitlines() if ln.startswith("holmes_ingest_records")]


def test_a_host_name_with_control_characters_is_refused(server):
    # it reached `holmes jobs` (terminal escapes) and the /metrics labels as sent
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    evil = "evil\x1b[31mRED\x1b[0m\nnext"
    r = c.post("/v1/jobs/jobEsc/batches", json=_agent_batch("n1", 0, [0, 1], evil, [0, 1]))
    assert r.status_code == 422 and r.json()["field"].startswith("ranks.host"), r.text
    assert "printable" in r.json()["detail"], r.text
    r = c.post("/v1/jobs/jobEsc/batches", json=_agent_batch("n1", 0, [0, 1], "", [0, 1]))
    assert r.status_code == 422 and r.json()["field"].startswith("ranks.host"), r.text
    r = c.post("/v1/jobs/jobEsc/batches", json=_agent_batch("n1", 0, [0, 1], "node-7", [0, 1]))
    assert r.status_code == 200, r.text


def test_a_locked_store_is_a_503_saying_so_and_the_batch_is_kept_on_retry(tmp_path):
    # another process holding the database: a bare "500 Internal Server Error" before
    srv = start_server(tmp_path)
    try:
        c = httpx.Client(base_url=srv.url, headers=auth(), timeout=30)
        body = _agent_batch("n1", 0, [0, 1], "h1", [0, 1])
        holder = sqlite3.connect(srv.db, isolation_level=None, timeout=1)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            r = c.post("/v1/jobs/jobLock/batches", json=body)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert r.status_code == 503 and r.json()["field"] == "store", r.text
        assert "database is locked" in r.json()["detail"] and "retry" in r.json()["detail"]
        r = c.post("/v1/jobs/jobLock/batches", json=body)  # the agent's retry
        assert r.status_code == 200 and not r.json()["duplicate"], r.text
        assert c.get("/v1/jobs/jobLock").json()["records"] == 6
    finally:
        srv.stop()


def test_the_gpu_an_agent_places_its_rank_on_names_the_device(tmp_path):
    # the ranks table's gpu was checked, then ignored: ranks were numbered in order on a host
    from holmes_ml.io.schema import member_ranks, without_labels
    from holmes_ml.pipeline import summarize
    from holmes_ml.simulator import FaultSpec, SimConfig, simulate

    sim = simulate(SimConfig(gpus=16, model="llama2-7b", tp=2, pp=2, iterations=8, seed=3,
                             faults=(FaultSpec.parse("gpu_slow:rank=5,severity=0.5"),)))
    s = summarize(without_labels(sim.ops), model="rule")
    ranks = sorted(s.iterations["rank"].unique().tolist())
    hosts = s.ranks.set_index("rank")["host"].astype(str)
    abnormal = s.abnormal[["iteration", "rank", "op", "group", "seq", "nbytes", "start_ns",
                           "duration_us", "score", "peer", "group_kind", "excess_us"]]
    body = {"source": "n1", "batch_id": "g0", "seq": 0,
            "ranks": {"rank": ranks, "host": [hosts[r] for r in ranks],
                      "gpu": [7 - r % 8 for r in ranks]},  # placed in reverse on each host
            "groups": [{"name": str(g.group), "kind": str(g.group_kind),
                        "ranks": list(member_ranks(g.group_ranks))}
                       for g in s.groups.itertuples()],
            "iterations": {k: s.iterations[k].tolist() for k in
                           ("iteration", "rank", "start_ns", "end_ns", "comm_us", "n_ops")},
            "abnormal": {k: abnormal[k].astype(float if k in ("duration_us", "score",
                                                              "excess_us") else
                                               object).tolist() for k in abnormal.columns}}
    srv = start_server(tmp_path, pipeline=True)  # the real localizer
    try:
        c = httpx.Client(base_url=srv.url, headers=auth(), timeout=30)
        r = c.post("/v1/jobs/jobGpu/batches", json=body)
        assert r.status_code == 200, r.text
        v = c.post("/v1/jobs/jobGpu/analyze").json()
    finally:
        srv.stop()
    assert v["candidates"] and v["candidates"][0]["ranks"] == [5], json.dumps(v)[:1500]
    assert v["candidates"][0]["device"] == f"gpu:{hosts[5]}/2", v


def test_a_database_file_removed_under_the_service_is_a_503_not_a_silent_loss(tmp_path):
    # the open connection went on acknowledging batches that were gone at the next start
    srv = start_server(tmp_path)
    try:
        c = httpx.Client(base_url=srv.url, headers=auth(), timeout=30)
        assert c.post("/v1/jobs/jobRm/batches",
                      json=_agent_batch("n1", 0, [0, 1], "h1", [0, 1])).status_code == 200
        for suffix in ("", "-wal", "-shm"):
            p = srv.db.with_name(srv.db.name + suffix)
            if p.exists():
                p.unlink()
        r = c.post("/v1/jobs/jobRm/batches", json=_agent_batch("n1", 1, [0, 1], "h1", [0, 1],
                                                               iteration=1))
        assert r.status_code == 503 and r.json()["field"] == "store", r.text
        assert "was removed or replaced while the service ran" in r.json()["detail"]
    finally:
        srv.stop()


def test_healthz_is_503_naming_why_when_the_store_cannot_take_writes(tmp_path):
    """/healthz said ok while every batch got 503 (the database file removed under it): a
    load balancer or a liveness probe saw a healthy service."""
    srv = start_server(tmp_path)
    try:
        ok = httpx.get(srv.url + "/healthz")
        assert ok.status_code == 200 and ok.json()["status"] == "ok", ok.text
        for suffix in ("", "-wal", "-shm"):
            p = srv.db.with_name(srv.db.name + suffix)
            if p.exists():
                p.unlink()
        for method in ("GET", "HEAD"):
            r = httpx.request(method, srv.url + "/healthz")
            assert r.status_code == 503, (method, r.text)
        body = httpx.get(srv.url + "/healthz").json()
        assert body["status"] == "unavailable" and body["field"] == "store", body
        assert body["detail"].startswith("store unusable: the database file"), body
        assert "removed or replaced" in body["detail"], body
    finally:
        srv.stop()


def test_healthz_remembers_a_failed_write_until_one_succeeds(tmp_path):
    import sqlite3

    from fastapi.testclient import TestClient
    from test_serve_support import ANALYZERS

    from holmes_ml.serve.app import ServeSettings, create_app

    settings = ServeSettings(db=tmp_path / "s.db", token=TOKEN, analyze_interval_s=0)
    with TestClient(create_app(settings, analyzers=ANALYZERS)) as c:
        store = c.app.state.service.store
        assert c.get("/healthz").status_code == 200
        try:
            with store._tx():
                raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError:
            pass
        r = c.get("/healthz")
        assert r.status_code == 503, r.text
        assert r.json()["detail"] == ("store unusable: the last write failed (database or "
                                      "disk is full)"), r.text
        assert c.post("/v1/jobs/h/batches", json=_agent_batch("n1", 0, [0], "h0", [0]),
                      headers=auth()).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_a_raw_batch_whose_communicator_lists_a_member_twice_is_refused(server):
    """As an agent's `groups`: a member list naming a rank twice is a 422 naming the row (it was
    stored, and the communicator counted one member too many)."""
    ops = make_ops(seed=3, ranks=2, iterations=2)
    body = raw_body(ops, "dup-members", seq=0)
    body["columns"]["group_ranks"] = ["0 1 1"] * len(ops)
    r = httpx.post(server.url + "/v1/jobs/dupm/raw", json=body, headers=auth(), timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "columns.group_ranks"
    assert "lists rank 1 twice (got '0 1 1'" in r.json()["detail"]
    assert httpx.get(server.url + "/v1/jobs/dupm").status_code == 404


def test_large_uploads_at_once_are_all_stored(server):
    # bodies of LARGE_BODY bytes or more are handled two at a time: four at once all land
    from concurrent.futures import ThreadPoolExecutor

    from holmes_ml.serve.app import LARGE_BODY

    ops = make_ops(seed=3, ranks=64, iterations=40, ops_per_iter=8)
    bodies = [json.dumps(raw_body(ops, f"big{i}", seq=None)).encode() for i in range(4)]
    assert min(map(len, bodies)) >= LARGE_BODY

    def post(i: int) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/jobs/big{i}/raw", content=bodies[i], timeout=120,
                          headers={**auth(), "Content-Type": "application/json"})

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(post, range(4)))
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    for i in range(4):
        assert httpx.get(f"{server.url}/v1/jobs/big{i}").json()["records"] == len(ops)


def test_body_limit_hands_on_large_bodies_a_few_at_a_time():
    # the middleware alone, on one event loop: the downstream app holds every large request
    # until released, so the gate's effect is seen without timing anything
    import asyncio

    from holmes_ml.serve.app import LARGE_BODY, BodyLimit

    async def scenario() -> tuple[int, list[int]]:
        inside, most = 0, 0
        release = asyncio.Event()
        statuses: list[int] = []

        async def downstream(scope, receive, send):
            nonlocal inside, most
            body = (await receive())["body"]
            inside += 1
            most = max(most, inside)
            if len(body) >= LARGE_BODY:
                await release.wait()
            inside -= 1
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        gate = BodyLimit(downstream, limit=2 * LARGE_BODY, max_large=2)

        async def request(size: int) -> None:
            async def receive():
                return {"type": "http.request", "body": b"x" * size, "more_body": False}

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            await gate({"type": "http", "method": "POST", "headers": []}, receive, send)

        large = [asyncio.create_task(request(LARGE_BODY)) for _ in range(5)]
        for _ in range(20):
            await asyncio.sleep(0)
        held = most
        await request(100)  # a small body passes while two large ones are held
        release.set()
        await asyncio.gather(*large)
        return held, statuses

    held, statuses = asyncio.run(scenario())
    assert held == 2
    assert statuses == [200] * 6


def _topology(hosts: list[str], groups: list[list[int]] | None = None) -> dict:
    n = len(hosts)
    gpu = [hosts[:r].count(h) for r, h in enumerate(hosts)]  # each rank its host's next GPU
    return {"ranks": {"rank": list(range(n)), "host": hosts, "gpu": gpu, "pod": [0] * n},
            "groups": [{"name": "dp-0", "kind": "dp", "ranks": g} for g in groups or []]}


def _stored_topology(server, job: str) -> dict | None:
    from holmes_ml.serve.store import Store

    store = Store(server.db)
    try:
        return store.topology(job)
    finally:
        store.close()


def test_a_topology_contradicting_the_jobs_batches_is_refused_and_the_stored_one_kept(server):
    """A topology placing a rank on another host than its agent said (hosts swapped, another
    job's topology) was stored with 200, and then every verdict failed on the two."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    assert c.post("/v1/jobs/jobTopo/batches",
                  json=_agent_batch("n1", 0, [0, 1], "h0", [0, 1])).status_code == 200
    assert c.post("/v1/jobs/jobTopo/batches",
                  json=_agent_batch("n2", 0, [2, 3], "h1", [0, 1, 2, 3])).status_code == 200
    good = _topology(["h0", "h0", "h1", "h1"], [[0, 1, 2, 3]])
    assert c.put("/v1/jobs/jobTopo/topology", json=good).status_code == 200
    swapped = _topology(["h0", "h1", "h0", "h1"], [[0, 1, 2, 3]])
    r = c.put("/v1/jobs/jobTopo/topology", json=swapped)
    assert r.status_code == 409 and r.json()["field"] == "ranks.host", r.text
    detail = r.json()["detail"]
    assert ("rank 1 is on host 'h1' in it, on host 'h0' since batch 'n1-0' of source 'n1' "
            "(and 1 more rank(s) on other hosts)") in detail, detail
    assert "\n" not in detail and "stored topology is unchanged" in detail
    smaller = _topology(["h0", "h0"], [[0, 1]])  # another job's
    r = c.put("/v1/jobs/jobTopo/topology", json=smaller)
    assert r.status_code == 409 and r.json()["field"] == "ranks.rank", r.text
    assert "not rank(s) 2, 3" in r.json()["detail"], r.text
    r = c.put("/v1/jobs/jobTopo/topology", json=_topology(["h0", "h0", "h1", "h1"], [[0, 1]]))
    assert r.status_code == 409 and r.json()["field"] == "groups.ranks", r.text
    # (both member lists were shown cut at 8: two lists alike for communicators that differ
    # further on)
    assert "has 2 ranks in it, 4 by the job's batches (ranks 2 3 only in the job's batches)" \
        in r.json()["detail"], r.text
    stored = _stored_topology(server, "jobTopo")
    assert stored is not None and stored["ranks"]["host"] == good["ranks"]["host"], stored


def test_an_agent_batch_contradicting_the_jobs_topology_is_refused(server):
    """The agent PUTs its --topology before its first batch: a batch then placing a rank on
    another host (or a rank the topology lacks) is refused, not stored to fail each verdict."""
    c = httpx.Client(base_url=server.url, headers=auth(), timeout=30)
    assert c.put("/v1/jobs/jobTopo2/topology",
                 json=_topology(["h0", "h0"], [[0, 1]])).status_code == 200
    r = c.post("/v1/jobs/jobTopo2/batches", json=_agent_batch("n1", 0, [0, 1], "h9", [0, 1]))
    assert r.status_code == 409 and r.json()["field"] == "ranks.host", r.text
    assert ("puts rank 0 on host 'h9'; it is on host 'h0' by the job's topology"
            in r.json()["detail"]), r.text
    r = c.post("/v1/jobs/jobTopo2/batches", json=_agent_batch("n1", 1, [1, 2], "h0", [0, 1, 2]))
    assert r.status_code == 409 and "rank 2 on host 'h0'; it is not placed" in r.json()["detail"]
    r = c.post("/v1/jobs/jobTopo2/batches", json=_agent_batch("n1", 2, [0, 1], "h0", [0, 1]))
    assert r.status_code == 200, r.text


def test_a_refused_sender_is_logged_at_the_service_once_a_minute(tmp_path, caplog):
    """An agent with a wrong token retried for minutes, a second agent got 409s: the service's
    log said nothing, only holmes_requests_rejected_total (no job, no sender) counted them."""
    from fastapi.testclient import TestClient

    from holmes_ml.serve.app import ServeSettings, create_app

    settings = ServeSettings(db=tmp_path / "s.db", token=TOKEN, analyze_interval_s=0)
    with TestClient(create_app(settings, analyzers=None)) as c, caplog.at_level("WARNING"):
        for _ in range(3):
            r = c.post("/v1/jobs/j1/batches", json=_agent_batch("n1", 0, [0], "h0", [0]),
                       headers={"Authorization": "Bearer WRONG"})
            assert r.status_code == 401
        assert c.get("/v1/jobs", headers={"Authorization": "Bearer WRONG"}).status_code in (
            200, 401)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused ")]
    assert said == ["refused POST /v1/jobs/j1/batches from testclient: HTTP 401 (said once a "
                    "minute per sender, path and status)"], said


def test_ranks_without_data_in_the_latest_verdict_are_gauges(tmp_path):
    """A host whose agent never started was only in the verdict's note: an alert needs a
    number (`holmes_job_silent_ranks`, `holmes_job_ranks_lacking_iterations`)."""
    from fastapi.testclient import TestClient

    from holmes_ml.serve.app import ServeSettings, create_app

    settings = ServeSettings(db=tmp_path / "s.db", token=TOKEN, analyze_interval_s=0)
    with TestClient(create_app(settings, analyzers=None)) as c:
        assert c.post("/v1/jobs/g/batches", json=_agent_batch("n1", 0, [0], "h0", [0]),
                      headers=auth()).status_code == 200
        body = {"irregular": False, "irregular_iterations": [], "candidates": [],
                "input": {"ops": 1, "ranks": 1, "iterations": 1, "silent_ranks": [8, 9, 10],
                          "lacking_ranks": [3]}}
        c.app.state.service.store.save_verdict("g", body, 1, None)
        metrics = c.get("/metrics").text
    assert 'holmes_job_silent_ranks{job="g"} 3.0' in metrics, metrics
    assert 'holmes_job_ranks_lacking_iterations{job="g"} 1.0' in metrics


#: The stand-in service localizing only when asked (--analyze-every 0: a job stays without a
#: verdict until then, not for half a second) and whose raw localizer fails on a job holding
#: records of 13 bytes (a localizer bug).
QUIET_LAUNCHER = test_serve_support.LAUNCHER.replace(
    "analyze_interval_s=0.5", "analyze_interval_s=0").replace(
    "def analyze(ops, topology=None, model=None):\n",
    "def analyze(ops, topology=None, model=None):\n"
    "    if (ops['nbytes'] == 13).any():\n"
    "        raise RuntimeError('a localizer bug')\n")
assert QUIET_LAUNCHER.count("analyze_interval_s=0)") == 1 and "a localizer bug" in QUIET_LAUNCHER


def start_quiet_server(tmp):
    """:func:`start_server` of :data:`QUIET_LAUNCHER`."""
    launcher = test_serve_support.LAUNCHER
    test_serve_support.LAUNCHER = QUIET_LAUNCHER
    try:
        return start_server(tmp)
    finally:
        test_serve_support.LAUNCHER = launcher


def jobs_in_every_verdict_state(c: httpx.Client) -> None:
    """On a :func:`start_quiet_server`: jobs ``bare`` (only its topology, asked for a verdict),
    ``pending`` (data, never localized), ``failed`` (its localization failed), ``healthy``
    (localized: nothing irregular) and ``sick`` (localized: rank 5 slow)."""
    assert c.put("/v1/jobs/bare/topology",
                 json=_topology(["h0", "h0"], [[0, 1]])).status_code == 200
    for job, ops in [("pending", make_ops(seed=2)),
                     ("failed", make_ops(seed=2).assign(nbytes=13)),
                     ("healthy", make_ops(seed=2, slow_rank=99)),
                     ("sick", make_ops(seed=2))]:
        r = c.post(f"/v1/jobs/{job}/raw", json=raw_body(ops, "b0", seq=0))
        assert r.status_code == 200, r.text
    for job in ("bare", "failed", "healthy", "sick"):
        assert c.post(f"/v1/jobs/{job}/analyze").status_code == 200


def test_a_job_without_a_verdict_says_why_and_is_not_read_as_healthy(tmp_path):
    """A job with data but no verdict answered `version` 0 and `irregular: false`, which a
    dashboard polling it read as healthy; one given only a topology and asked for a verdict
    got a verdict of nothing (version 1, `irregular: false`, `holmes_job_slowdown` 1). Now the
    answer says there is none and why (`state`), `irregular` is null, and /metrics has no
    verdict gauge of it but `holmes_job_verdict_state`."""
    srv = start_quiet_server(tmp_path)
    try:
        c = httpx.Client(base_url=srv.url, headers=auth(), timeout=30)
        r = c.get("/v1/jobs/nobody/verdict")
        assert r.status_code == 404 and r.json()["field"] == "job", r.text
        jobs_in_every_verdict_state(c)
        v = {job: c.get(f"/v1/jobs/{job}/verdict").json()
             for job in ("bare", "pending", "failed", "healthy", "sick")}
        for job in ("bare", "pending", "failed"):
            assert (v[job]["version"], v[job]["computed_at"], v[job]["data_batches"],
                    v[job]["irregular_iterations"], v[job]["candidates"]) == (0, 0.0, 0, [], []), v
            assert "irregular" in v[job] and v[job]["irregular"] is None, v[job]
            assert v[job]["note"].startswith("no verdict yet: "), v[job]
        assert (v["bare"]["state"], v["bare"]["stale"], v["bare"]["error"]) == (
            "no_data", False, None), v["bare"]
        assert "no data has come for the job (only its topology)" in v["bare"]["note"]
        assert (v["pending"]["state"], v["pending"]["stale"], v["pending"]["error"]) == (
            "pending", True, None), v["pending"]
        assert "--analyze-every 0" in v["pending"]["note"]
        assert "POST /v1/jobs/pending/analyze asks for it now" in v["pending"]["note"]
        assert (v["failed"]["state"], v["failed"]["stale"], v["failed"]["error"]) == (
            "failed", True, "localization failed: RuntimeError: a localizer bug"), v["failed"]
        assert "localizing the job's data failed (error says why)" in v["failed"]["note"]
        # a verdict keeps its meaning: healthy is false, irregular is true
        assert (v["healthy"]["state"], v["healthy"]["version"], v["healthy"]["irregular"],
                v["healthy"]["candidates"], v["healthy"]["error"]) == (
            "analysed", 1, False, [], None), v["healthy"]
        assert (v["sick"]["state"], v["sick"]["irregular"]) == ("analysed", True), v["sick"]
        assert v["sick"]["candidates"][0]["ranks"] == [5]
        assert c.get("/v1/jobs/pending/candidates").json() == []
        listed = {j["job"]: j["verdict_state"] for j in c.get("/v1/jobs").json()}
        assert listed == {"bare": "no_data", "pending": "pending", "failed": "failed",
                          "healthy": "analysed", "sick": "analysed"}, listed
        assert c.get("/v1/jobs/failed").json()["verdict_state"] == "failed"
        metrics = c.get("/metrics").text.splitlines()
        for job, state in listed.items():
            for s in ("analysed", "no_data", "pending", "failed"):
                line = f'holmes_job_verdict_state{{job="{job}",state="{s}"}} ' + (
                    "1.0" if s == state else "0.0")
                assert line in metrics, (line, [m for m in metrics if job in m])
            failing = f'holmes_job_analysis_failed{{job="{job}"}} ' + (
                "1.0" if job == "failed" else "0.0")
            assert failing in metrics, failing
            gauges = [m for m in metrics if f'job="{job}"' in m and m.startswith((
                "holmes_job_slowdown", "holmes_job_irregular_iterations",
                "holmes_job_verdict_age_seconds", "holmes_job_top_candidate_score"))]
            assert len(gauges) == (3 if job == "healthy" else 4 if job == "sick" else 0), gauges
        assert 'holmes_job_slowdown{job="healthy"} 1.0' in metrics
        # newer data failing to localize: the verdict is kept, stale, with the reason
        newer = make_ops(seed=3).assign(nbytes=13, iteration=lambda d: d["iteration"] + 100)
        assert c.post("/v1/jobs/healthy/raw", json=raw_body(newer, "b1", seq=1)
                      ).status_code == 200
        kept = c.post("/v1/jobs/healthy/analyze").json()
        assert (kept["state"], kept["version"], kept["irregular"], kept["stale"],
                kept["error"]) == ("analysed", 1, False, True,
                                   "localization failed: RuntimeError: a localizer bug"), kept
        assert 'holmes_job_analysis_failed{job="healthy"} 1.0' in c.get("/metrics").text
        # once localized, the pending job has its verdict; asking again of a job of no data
        # still makes none
        done = c.post("/v1/jobs/pending/analyze").json()
        assert (done["state"], done["version"], done["irregular"], done["note"]) == (
            "analysed", 1, True, None), done
        assert c.post("/v1/jobs/bare/analyze").json()["state"] == "no_data"
        # the OpenAPI schema says so to generated clients
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
        out = schemas["VerdictOut"]["properties"]
        assert out["state"]["enum"] == ["no_data", "pending", "failed", "analysed"], out["state"]
        assert {"type": "null"} in out["irregular"]["anyOf"], out["irregular"]
        assert "null while the job has no verdict" in out["irregular"]["description"]
        assert schemas["JobOut"]["properties"]["verdict_state"]["enum"] == out["state"]["enum"]
    finally:
        srv.stop()
