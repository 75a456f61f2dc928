"""Topology: device naming, routing, JSON round trip, derivation from logs."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from holmes_ml.io.schema import SchemaError
from holmes_ml.topology import Group, Topology, device_kind, kind_from_group_name


def _two_pods(hosts_per_pod: int = 2, pods: int = 2, spines: int = 4) -> Topology:
    rows = []
    for h in range(hosts_per_pod * pods):
        for g in range(8):
            rows.append({"rank": h * 8 + g, "host": f"node{h:03d}", "gpu": g, "pod": h // hosts_per_pod})
    ranks = pd.DataFrame(rows)
    for k in ("tp", "cp", "ep", "dp", "pp"):
        ranks[k] = -1
    ranks["tp"] = ranks["rank"] % 8
    ranks["dp"] = ranks["rank"] // 8
    return Topology(ranks=ranks, groups={"dp-0": Group("dp-0", "dp", (0, 8, 16, 24))}, spines=spines)


def test_paths_follow_rails_and_spines():
    topo = _two_pods()
    assert topo.path(0, 1) == ()  # same host: NVLink
    same_leaf = topo.path(0, 8)  # GPU 0 of two hosts in pod 0
    assert same_leaf == ("nic:node000/0", "switch:leaf-p0-r0", "nic:node001/0")
    cross = topo.path(0, 16)  # pod 0 -> pod 1
    assert cross[0] == "nic:node000/0" and cross[-1] == "nic:node002/0"
    assert any(d.startswith("switch:spine-") for d in cross)
    assert sum(d.startswith("link:") for d in cross) == 2
    assert topo.path(0, 16) == topo.path(16, 0)[::-1] or set(topo.path(0, 16)) == set(topo.path(16, 0))


def test_collective_devices_and_ranks_on():
    topo = _two_pods()
    devs = topo.collective_devices((0, 8, 16, 24))
    assert {"nic:node000/0", "nic:node003/0", "switch:leaf-p0-r0", "switch:leaf-p1-r0"} <= devs
    assert topo.ranks_on("nic:node001/0") == [8]
    assert topo.ranks_on("host:node001") == list(range(8, 16))
    assert topo.ranks_on("switch:leaf-p1-r3") == [19, 27]
    assert topo.ranks_on("link:leaf-p1-r3~spine-1") == [19, 27]
    assert topo.ranks_on("switch:spine-0") == list(range(32))
    assert topo.coords_of(9) == {"tp": 1, "dp": 1}


@pytest.mark.parametrize(("device", "says"), [
    ("switch:nonexistent", "expected switch:leaf-pPOD-rRAIL, switch:spine-S or link:"),
    ("link:foo~bar", "expected switch:leaf-pPOD-rRAIL"),
    ("link:leaf-p0-r0", "expected switch:leaf-pPOD-rRAIL"),
    ("switch:spine-7", "has 4 spine(s); expected spine-0 ... spine-3"),
    ("link:leaf-p0-r0~spine-4", "has 4 spine(s)"),
    ("switch:leaf-p5-r0", "no rank of this job sits below leaf-p5-r0"),
])
def test_a_switch_or_link_the_fabric_lacks_is_refused(device, says):
    # read as a spine above everyone, any made-up switch id stood for every rank of the job
    with pytest.raises(ValueError, match=re.escape(says)):
        _two_pods().ranks_on(device)


def test_json_round_trip(tmp_path):
    topo = _two_pods()
    path = tmp_path / "topology.json"
    topo.to_json(path)
    back = Topology.from_json(path)
    assert back.world_size == topo.world_size and back.spines == topo.spines
    assert back.groups == topo.groups
    assert back.path(0, 16) == topo.path(0, 16)


def test_bad_topology_file_names_the_problem(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="t.json"):
        Topology.from_json(p)
    p.write_text('{"ranks": {"rank": [0]}}')
    with pytest.raises(ValueError, match=r"t.json.*ranks.host"):
        Topology.from_json(p)


def _edited(edit) -> dict:
    data = json.loads(json.dumps(_two_pods().to_dict()))
    edit(data)
    return data


BAD_TOPOLOGIES = {
    "ranks a list": (lambda d: d.update(ranks=[0, 1]), r"ranks\[0\]: wrong type \(got 'int'"),
    "record short": (lambda d: d.update(ranks=[{"rank": 0, "host": "a", "gpu": 0, "pod": 0},
                                               {"rank": 1, "host": "a", "pod": 0}]),
                     r"ranks\.gpu\[1\]: not an integer \(got 'null'"),
    "rank text": (lambda d: d["ranks"]["rank"].__setitem__(3, "x"),
                  r"ranks\.rank\[3\]: not an integer \(got 'x'"),
    "rank twice": (lambda d: d["ranks"]["rank"].__setitem__(3, 2),
                   r"ranks\.rank: rank listed twice \(got 2"),
    "gpu negative": (lambda d: d["ranks"]["gpu"].__setitem__(0, -1),
                     r"ranks\.gpu\[0\]: out of range \(got -1"),
    "ragged": (lambda d: d["ranks"]["host"].pop(), r"ranks\.host: columns of unequal length"),
    "gpu twice": (lambda d: d["ranks"]["gpu"].__setitem__(1, d["ranks"]["gpu"][0]),
                  r"ranks\.gpu\[1\]: two ranks on one GPU \(got \"rank 1 on GPU 0 of host "
                  r"'\w+', as rank 0\""),
    "host empty": (lambda d: d["ranks"]["host"].__setitem__(5, ""),
                   r"ranks\.host\[5\]: not a host name"),
    "host surrogate": (lambda d: d["ranks"]["host"].__setitem__(2, "n\ud800"),
                       r"ranks\.host\[2\]: not a host name"),
    "groups an object": (lambda d: d.update(groups={"dp-0": [0, 8]}),
                         r"groups: wrong type \(got 'dict'"),
    "member unknown": (lambda d: d["groups"][0]["ranks"].append(999),
                       r"groups\[0\]\.ranks: a member that is not a rank .*got 999"),
    "member bool": (lambda d: d["groups"][0]["ranks"].__setitem__(1, True),
                    r"groups\[0\]\.ranks\[1\]: not an integer"),
    "group twice": (lambda d: d["groups"].append(d["groups"][0]),
                    r"groups\[1\]\.name: communicator listed twice"),
    "gpus_per_host": (lambda d: d.update(gpus_per_host="eight"),
                      r"gpus_per_host: not an integer \(got 'eight'"),
    "parallel zero": (lambda d: d.update(parallel={"tp": 0}), r"parallel\.tp: out of range"),
}


@pytest.mark.parametrize("case", BAD_TOPOLOGIES)
def test_a_hand_edited_topology_is_refused_naming_key_and_value(tmp_path, case):
    """Each was a raw pandas/Python error, a misleading "missing" message, or read as is
    (a duplicated rank, a member outside the job, a boolean rank)."""
    edit, message = BAD_TOPOLOGIES[case]
    p = tmp_path / "topology.json"
    p.write_text(json.dumps(_edited(edit)))
    with pytest.raises(SchemaError, match=message) as e:
        Topology.from_json(p)
    assert str(p) in str(e.value)


def test_ranks_may_be_listed_one_object_per_rank():
    columns = _two_pods().to_dict()
    rows = pd.DataFrame(columns["ranks"]).to_dict("records")
    back = Topology.from_dict({**columns, "ranks": rows})
    pd.testing.assert_frame_equal(back.ranks, Topology.from_dict(columns).ranks)


def test_from_ops_uses_group_ranks_and_hosts():
    ops = pd.DataFrame(
        {
            "rank": [0, 1, 2, 3],
            "group": ["dp-0", "dp-0", "tp-1", "tp-1"],
            "group_ranks": ["0 1", "0 1", "2 3", "2 3"],
            "host": ["a", "b", "b", "b"],
        }
    )
    topo = Topology.from_ops(ops)
    assert topo.host_of(0) == "a" and topo.gpu_of(3) == "gpu:b/2"
    assert topo.groups["tp-1"] == Group("tp-1", "tp", (2, 3))
    assert topo.path(0, 1) == ("nic:a/0", "nic:b/0")


def test_device_kinds():
    assert device_kind("link:leaf-p0-r1~spine-2") == "link"
    with pytest.raises(ValueError, match="kind prefix"):
        device_kind("eth0")
    assert kind_from_group_name("dp-3-1") == "dp"
    assert kind_from_group_name("mystery") == "other"


def test_a_topology_of_another_version_is_read_with_a_warning(caplog):
    data = {"ranks": {"rank": [0, 1], "host": ["a", "a"], "gpu": [0, 1], "pod": [0, 0]}}
    with caplog.at_level("WARNING"):
        Topology.from_dict(dict(data, version=1), source="t.json")
    assert caplog.text == ""
    with caplog.at_level("WARNING"):
        t = Topology.from_dict(dict(data, version=99), source="t.json")
    assert t.world_size == 2 and "t.json: topology version 99" in caplog.text
    assert Topology.from_dict(t.to_dict()).to_dict()["version"] == 1


@pytest.mark.parametrize(("hosts", "expected"), [
    # a launcher's blocks of 8, ranks 3 and 9 silent: their neighbours keep their GPUs
    ({"a": [0, 1, 2, 4, 5, 6, 7], "b": [8, 10, 11, 12, 13, 14, 15]},
     [0, 1, 2, 4, 5, 6, 7, 0, 2, 3, 4, 5, 6, 7]),
    # 4-GPU hosts: blocks of 4 (not of the default 8)
    ({"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}, [0, 1, 2, 3, 0, 1, 2, 3]),
    # ranks dealt round-robin over hosts: no blocks, numbered in rank order on each host
    ({"a": [0, 2, 4, 6], "b": [1, 3, 5, 7]}, [0, 0, 1, 1, 2, 2, 3, 3]),
])
def test_from_ops_numbers_gpus_by_the_launchers_blocks_where_the_ranks_fit_them(hosts, expected):
    rows = [(r, h) for h, rs in hosts.items() for r in rs]
    ops = pd.DataFrame({"iteration": 0, "rank": [r for r, _ in rows], "op": "barrier",
                        "group": "world", "seq": 0, "nbytes": 0, "start_ns": 1,
                        "duration_us": 1.0, "host": [h for _, h in rows]})
    topo = Topology.from_ops(ops)
    assert topo.ranks.sort_values("rank")["gpu"].tolist() == expected


def test_an_agent_seeing_one_host_numbers_its_ranks_by_their_own_block():
    """One 4-GPU host's ranks 4-7 fit a block of 8 as well as one of 4: an agent, which sees
    one host, tries the block its host's ranks fill first (GPUs 0-3), and a block of 8 when its
    host's ranks leave gaps (rank 9 of 8-15 not logged)."""
    from holmes_ml.topology import local_index

    four = pd.DataFrame({"rank": [4, 5, 6, 7], "host": "b"})
    assert local_index(four, 8, seen_first=True).tolist() == [0, 1, 2, 3]
    assert local_index(four, 8).tolist() == [4, 5, 6, 7]
    gappy = pd.DataFrame({"rank": [8, 10, 11, 12, 13, 14, 15], "host": "b"})
    assert local_index(gappy, 8, seen_first=True).tolist() == [0, 2, 3, 4, 5, 6, 7]
