"""Cluster and job topology: where each rank runs and which devices its traffic crosses.

Shared by the simulator (which builds one from a parallel layout) and by localization (which
reads it from ``topology.json`` or derives a minimal one from the CommOps table).

Device identifiers are strings with a kind prefix, so one namespace covers every suspect:

=================  ==========================================================
``gpu:H/g``        GPU ``g`` of host ``H``
``nic:H/g``        the NIC serving that GPU (one NIC per GPU, rail-optimized)
``host:H``         the host (CPU, memory, dataloader)
``switch:L``       a leaf switch (``leaf-p{pod}-r{rail}``) or spine (``spine-{s}``)
``link:L~S``       the cable between leaf ``L`` and spine ``S``
=================  ==========================================================
"""

from __future__ import annotations

import json
import logging
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from holmes_ml.io.schema import SchemaError, member_ranks

logger = logging.getLogger(__name__)

#: GPUs of one host where neither the logs nor a topology place the ranks: rank r is then
#: assumed on host ``host-{r // 8}``, GPU ``r % 8`` (:func:`assumed_host`).
GPUS_PER_HOST = 8


def assumed_host(rank: int, gpus_per_host: int = GPUS_PER_HOST) -> tuple[str, int]:
    """Host and GPU index of ``rank`` when nothing places it: consecutive ranks share a host.

    >>> assumed_host(13)
    ('host-1', 5)
    """
    return f"host-{rank // gpus_per_host}", rank % gpus_per_host

#: The version of the topology.json layout :meth:`Topology.to_dict` writes.
TOPOLOGY_VERSION = 1

#: Parallelism dimensions in Megatron's default order, fastest-varying first.
COORD_KINDS: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
DEVICE_KINDS: tuple[str, ...] = ("gpu", "nic", "host", "switch", "link")


def device_kind(device: str) -> str:
    """Kind prefix of a device id (``'nic:h/3'`` -> ``'nic'``)."""
    kind, sep, _ = device.partition(":")
    if not sep or kind not in DEVICE_KINDS:
        raise ValueError(f"device id {device!r} has no known kind prefix; expected one of {DEVICE_KINDS}")
    return kind


def route(
    a: int, b: int, end_a: tuple[str, str, str], end_b: tuple[str, str, str], spines: int
) -> tuple[str, ...]:
    """Devices a flow between ranks ``a`` and ``b`` crosses, given each end's
    ``(host, nic id, leaf switch id)``: the one routing rule every caller shares.

    Same host: NVLink only, so no network device. No spines: NIC to NIC. Same leaf (same pod
    and rail): NIC, leaf, NIC. Otherwise up through a spine chosen by a deterministic ECMP hash
    of the pair.
    """
    (ha, na, la), (hb, nb, lb) = end_a, end_b
    if ha == hb:
        return ()
    if spines <= 0:
        return (na, nb)
    if la == lb:
        return (na, la, nb)
    spine = f"spine-{zlib.crc32(f'{min(a, b)}-{max(a, b)}'.encode()) % spines}"
    return (
        na,
        la,
        f"link:{la.split(':', 1)[1]}~{spine}",
        f"switch:{spine}",
        f"link:{lb.split(':', 1)[1]}~{spine}",
        lb,
        nb,
    )


@dataclass(frozen=True)
class Group:
    """A communicator: its unique name, kind (tp/dp/pp/ep/cp/...) and member ranks in order."""

    name: str
    kind: str
    ranks: tuple[int, ...]


def kind_from_group_name(name: str) -> str:
    """Best-effort group kind from a name such as ``'dp-1-0'`` (``'dp'``); ``'other'`` if unknown."""
    head = name.split("-", 1)[0].split("_", 1)[0].lower()
    return head if head in COORD_KINDS or head in {"world", "mp", "emb", "pos"} else "other"


def _ints(values: list, field: str, source: str, lo: int, hi: int) -> list[int]:
    """A JSON list of ints in ``[lo, hi]``; :class:`SchemaError` naming ``field[i]`` and the
    value at the first that is not one."""
    from holmes_ml.io._common import as_int

    # Python ints (not bools) within bounds, checked in bulk: topologies list 10^5 ranks
    if all(type(v) is int for v in values) and (not values or lo <= min(values)
                                                 and max(values) <= hi):
        return values
    return [as_int(v, f"{field}[{i}]", source, lo=lo, hi=hi) for i, v in enumerate(values)]


@dataclass(frozen=True)
class Topology:
    """Placement of ranks on hosts/GPUs/NICs/switches, and the job's communicators.

    Parameters
    ----------
    ranks:
        One row per global rank with columns ``rank``, ``host``, ``gpu`` (local index),
        ``pod`` and, where known, the parallel coordinates ``tp, cp, ep, dp, pp`` (-1 if unknown).
    groups:
        Communicators by name.
    spines:
        Number of spine switches (0 when the fabric is unknown: then only NICs/hosts are named).
    parallel:
        Parallel sizes, e.g. ``{"tp": 8, "pp": 4, "dp": 2}``.
    source:
        Where it was read from (the file), for errors that refuse it.
    """

    ranks: pd.DataFrame
    groups: dict[str, Group] = field(default_factory=dict)
    spines: int = 0
    parallel: dict[str, int] = field(default_factory=dict)
    gpus_per_host: int = GPUS_PER_HOST
    source: str = field(default="topology", compare=False)

    # ----------------------------------------------------------------- identities
    @property
    def world_size(self) -> int:
        return int(len(self.ranks))

    def _row(self, rank: int) -> pd.Series:
        return self.ranks.iloc[int(self._index[int(rank)])]

    @property
    def _index(self) -> dict[int, int]:
        # Cached lazily on the instance; frozen dataclass so go through object.__setattr__.
        cache = self.__dict__.get("_rank_index")
        if cache is None:
            cache = {int(r): i for i, r in enumerate(self.ranks["rank"].to_numpy())}
            object.__setattr__(self, "_rank_index", cache)
        return cache

    def host_of(self, rank: int) -> str:
        return str(self._row(rank)["host"])

    def gpu_of(self, rank: int) -> str:
        row = self._row(rank)
        return f"gpu:{row['host']}/{int(row['gpu'])}"

    def nic_of(self, rank: int) -> str:
        row = self._row(rank)
        return f"nic:{row['host']}/{int(row['gpu'])}"

    def leaf_of(self, rank: int) -> str | None:
        if self.spines <= 0:
            return None
        row = self._row(rank)
        return f"switch:leaf-p{int(row['pod'])}-r{int(row['gpu'])}"

    def coords_of(self, rank: int) -> dict[str, int] | None:
        row = self._row(rank)
        coords = {k: int(row[k]) for k in COORD_KINDS if k in row.index and int(row[k]) >= 0}
        return coords or None

    def ranks_on(self, device: str) -> list[int]:
        """Global ranks whose GPU, NIC or host is ``device`` (switches/links: ranks below them)."""
        kind = device_kind(device)
        body = device.split(":", 1)[1]
        r = self.ranks
        if kind in ("gpu", "nic"):
            host, _, g = body.rpartition("/")
            if not host or not g.isdigit():
                raise ValueError(f"device id {device!r}: expected {kind}:HOST/INDEX, e.g. "
                                 f"{kind}:node003/5")
            mask = (r["host"] == host) & (r["gpu"] == int(g))
        elif kind == "host":
            mask = r["host"] == body
            if not mask.any() and (r["host"] == body.rpartition("/")[0]).any():
                raise ValueError(f"device id {device!r}: expected host:HOST (a whole host, no "
                                 f"/INDEX; gpu:{body} names one GPU)")
        else:  # a switch, or a link: the ranks below its leaf (a spine: everybody)
            leaf, tilde, spine = body.partition("~") if kind == "link" else (
                (body, "", "") if body.startswith("leaf-") else ("", "", body))
            m = re.fullmatch(r"leaf-p(\d+)-r(\d+)", leaf)
            s = re.fullmatch(r"spine-(\d+)", spine)
            if (kind == "link" and not (tilde and m and s)) or (leaf and not m) \
                    or (spine and not s):
                raise ValueError(f"device id {device!r}: expected switch:leaf-pPOD-rRAIL, "
                                 "switch:spine-S or link:leaf-pPOD-rRAIL~spine-S")
            if s and int(s.group(1)) >= self.spines:
                raise ValueError(f"device id {device!r}: this job's fabric has "
                                 f"{self.spines} spine(s)"
                                 + (f"; expected spine-0 ... spine-{self.spines - 1}"
                                    if self.spines else ""))
            if m is None:
                mask = np.ones(len(r), dtype=bool)
            else:
                mask = (r["pod"] == int(m.group(1))) & (r["gpu"] == int(m.group(2)))
                if not mask.any():
                    raise ValueError(f"device id {device!r}: no rank of this job sits below "
                                     f"{leaf} (pod {m.group(1)}, rail {m.group(2)})")
        return sorted(int(x) for x in r.loc[mask, "rank"])

    # ----------------------------------------------------------------- routing
    def path(self, a: int, b: int) -> tuple[str, ...]:
        """Devices a flow from rank ``a`` to rank ``b`` crosses (GPUs excluded).

        Same host: NVLink only, so no network device. Same leaf (same pod and rail): NIC, leaf,
        NIC. Otherwise up through a spine chosen by a deterministic ECMP hash of the pair.
        """
        la, lb = (self.leaf_of(a), self.leaf_of(b)) if self.spines > 0 else ("", "")
        return route(a, b, (self.host_of(a), self.nic_of(a), la or ""),
                     (self.host_of(b), self.nic_of(b), lb or ""), self.spines)

    def collective_devices(self, ranks: Sequence[int]) -> set[str]:
        """Network devices crossed by a ring over ``ranks`` (the algorithm NCCL uses for large
        messages); a two-member group is a single bidirectional flow."""
        members = list(ranks)
        devices: set[str] = set()
        if len(members) < 2:
            return devices
        for i, a in enumerate(members):
            b = members[(i + 1) % len(members)]
            devices.update(self.path(a, b))
        return devices

    # ----------------------------------------------------------------- I/O
    def to_dict(self) -> dict:
        cols = {c: self.ranks[c].tolist() for c in self.ranks.columns}
        return {
            "version": TOPOLOGY_VERSION,
            "gpus_per_host": self.gpus_per_host,
            "spines": self.spines,
            "parallel": dict(self.parallel),
            "ranks": cols,
            "groups": [
                {"name": g.name, "kind": g.kind, "ranks": list(g.ranks)} for g in self.groups.values()
            ],
        }

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def from_dict(cls, data: dict, source: str = "topology") -> Topology:
        """The topology :meth:`to_dict` wrote; a :class:`SchemaError` naming ``source``, the
        key and the value for anything else (a hand-edited or foreign file).

        Examples
        --------
        >>> t = Topology.from_dict({"ranks": {"rank": [0, 1], "host": ["a", "a"],
        ...                                   "gpu": [0, 1], "pod": [0, 0]}})
        >>> t.world_size
        2
        >>> Topology.from_dict({"ranks": {"rank": [0, 0], "host": ["a", "a"], "gpu": [0, 1],
        ...                               "pod": [0, 0]}})
        Traceback (most recent call last):
        ...
        holmes_ml.io.schema.SchemaError: topology, ranks.rank: rank listed twice (got 0; expected each rank once)
        """
        from holmes_ml.io._common import MAX_WORLD, as_int, as_obj

        if not isinstance(data, dict):
            raise SchemaError(
                f"not a holmes_ml topology (a JSON {type(data).__name__}, not an object)",
                source=source, expected="an object with keys 'ranks' and 'groups'",
            )
        version = data.get("version", TOPOLOGY_VERSION)
        if version != TOPOLOGY_VERSION:
            logger.warning("%s: topology version %r, this holmes_ml writes version %d: read as "
                           "that version (keys it does not know are ignored)", source, version,
                           TOPOLOGY_VERSION)
        raw = data.get("ranks")
        if isinstance(raw, list):
            # one object per rank (hand-written) rather than one list per column
            rows = [as_obj(r, f"ranks[{i}]", source) for i, r in enumerate(raw)]
            keys = list(dict.fromkeys(k for r in rows for k in r))
            raw = {k: [r.get(k) for r in rows] for k in keys}
        columns = as_obj(raw, "ranks", source)
        missing = [c for c in ("rank", "host", "gpu", "pod") if c not in columns]
        if missing:
            raise SchemaError(f"not a holmes_ml topology (missing ranks.{missing[0]})",
                              source=source, parameter="ranks",
                              expected="keys 'ranks' (with rank, host, gpu, pod) and 'groups'")
        n = len(as_obj(columns["rank"], "ranks.rank", source, list))
        ranks = pd.DataFrame(index=range(n))
        for col, values in columns.items():
            values = as_obj(values, f"ranks.{col}", source, list)
            if len(values) != n:
                raise SchemaError("columns of unequal length", source=source,
                                  parameter=f"ranks.{col}", value=len(values),
                                  expected=f"{n} values, one per rank (as ranks.rank)")
            if col == "host":
                bad = [i for i, v in enumerate(values)
                       if not isinstance(v, str) or not v or not v.isprintable()]
                if bad:
                    raise SchemaError("not a host name", source=source,
                                      parameter=f"ranks.host[{bad[0]}]", value=values[bad[0]],
                                      expected="a non-empty printable string")
                ranks[col] = values
            elif col in ("rank", "gpu", "pod", *COORD_KINDS):
                lo = -1 if col in COORD_KINDS else 0
                hi = MAX_WORLD - 1
                ranks[col] = np.array(_ints(values, f"ranks.{col}", source, lo, hi),
                                      dtype=np.int64)
            else:
                ranks[col] = values  # an extra column of a newer writer: kept as it is
        twice = ranks["rank"].duplicated().to_numpy()
        if twice.any():
            raise SchemaError("rank listed twice", source=source, parameter="ranks.rank",
                              value=int(ranks["rank"].to_numpy()[twice][0]),
                              expected="each rank once")
        place = ranks.duplicated(["host", "gpu"]).to_numpy()
        if place.any():
            i = int(np.flatnonzero(place)[0])
            host, gpu = ranks["host"].iloc[i], int(ranks["gpu"].iloc[i])
            first = int(ranks["rank"][(ranks["host"] == host) & (ranks["gpu"] == gpu)].iloc[0])
            raise SchemaError("two ranks on one GPU", source=source, parameter=f"ranks.gpu[{i}]",
                              value=f"rank {int(ranks['rank'].iloc[i])} on GPU {gpu} of host "
                                    f"{host!r}, as rank {first}",
                              expected="each (host, gpu) once: a GPU runs one rank")
        known = set(ranks["rank"].tolist())
        groups: dict[str, Group] = {}
        for k, g in enumerate(as_obj(data.get("groups"), "groups", source, list, default=[])):
            where = f"groups[{k}]"
            g = as_obj(g, where, source)
            name = as_obj(g.get("name"), f"{where}.name", source, str)
            kind = as_obj(g.get("kind"), f"{where}.kind", source, str, default="other")
            members = tuple(_ints(as_obj(g.get("ranks"), f"{where}.ranks", source, list),
                                  f"{where}.ranks", source, 0, MAX_WORLD - 1))
            if not known.issuperset(members):
                outside = [r for r in members if r not in known]
                raise SchemaError("a member that is not a rank of the topology", source=source,
                                  parameter=f"{where}.ranks", value=outside[0],
                                  expected="ranks listed in ranks.rank")
            if name in groups:
                raise SchemaError("communicator listed twice", source=source,
                                  parameter=f"{where}.name", value=name,
                                  expected="each communicator once")
            groups[name] = Group(name, kind, members)
        parallel = as_obj(data.get("parallel"), "parallel", source, default={})
        return cls(
            ranks=ranks,
            groups=groups,
            spines=as_int(data.get("spines"), "spines", source, lo=0, hi=MAX_WORLD, default=0),
            parallel={str(k): as_int(v, f"parallel.{k}", source, lo=1, hi=MAX_WORLD)
                      for k, v in parallel.items()},
            gpus_per_host=as_int(data.get("gpus_per_host"), "gpus_per_host", source, lo=1,
                                 hi=MAX_WORLD, default=8),
            source=source,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> Topology:
        from holmes_ml.io._common import regular_file

        path = regular_file(path, "a topology.json as holmes simulate writes it")
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except RecursionError:
            raise SchemaError("JSON nested too deeply", source=str(path),
                              expected="a topology.json as holmes simulate writes it") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SchemaError(f"not valid JSON ({exc})", source=str(path),
                              expected="a topology.json as holmes simulate writes it") from exc
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_ops(cls, ops: pd.DataFrame, gpus_per_host: int = GPUS_PER_HOST) -> Topology:
        """Derive a minimal topology from a canonical CommOps table.

        Hosts come from the ``host`` column when present, otherwise consecutive blocks of
        ``gpus_per_host`` ranks are assumed to share a host. Group members come from
        ``group_ranks`` when present, otherwise from the ranks seen logging the group. Parallel
        coordinates are taken from columns named ``tp, cp, ep, dp, pp`` if a reader supplied them.
        The fabric above the NICs is unknown, so no switches or links are named.
        """
        per_rank = ops.groupby("rank", sort=True)
        ranks = pd.DataFrame({"rank": np.asarray(sorted(per_rank.groups), dtype=np.int64)})
        if "host" in ops.columns and (ops["host"].astype(str).str.len() > 0).all():
            hosts = per_rank["host"].first().astype(str)
            ranks["host"] = hosts.reindex(ranks["rank"]).to_numpy()
            ranks["gpu"] = local_index(ranks, gpus_per_host)
        else:
            ranks["host"] = [assumed_host(r, gpus_per_host)[0] for r in ranks["rank"]]
            ranks["gpu"] = (ranks["rank"] % gpus_per_host).to_numpy()
        ranks["pod"] = 0
        for k in COORD_KINDS:
            if k in ops.columns:
                ranks[k] = per_rank[k].first().reindex(ranks["rank"]).fillna(-1).astype(int).to_numpy()
            else:
                ranks[k] = -1
        groups: dict[str, Group] = {}
        has_list = "group_ranks" in ops.columns
        kinds = ops.groupby("group")["group_kind"].first() if "group_kind" in ops.columns else None
        for name, sub in ops.groupby("group", sort=False):
            members: Iterable[int]
            listed = sub["group_ranks"].iloc[0] if has_list else ""
            if listed:
                members = member_ranks(listed)
            else:
                members = sorted(int(x) for x in sub["rank"].unique())
            kind = str(kinds[name]) if kinds is not None and kinds[name] else kind_from_group_name(str(name))
            groups[str(name)] = Group(str(name), kind, tuple(members))
        return cls(ranks=ranks, groups=groups, spines=0, parallel={}, gpus_per_host=gpus_per_host)


def local_index(ranks: pd.DataFrame, gpus_per_host: int, seen_first: bool = False
                ) -> np.ndarray:
    """Each rank's GPU index on its host (``ranks``: one row per rank, ``rank`` and ``host``).

    Where each host's ranks lie in a block of its own of ``n`` consecutive ranks starting at a
    multiple of ``n`` (a launcher's ``rank = node * n + local_rank``), the index is ``rank % n``
    (``n``: ``gpus_per_host``, else the most ranks one host logged; that first with
    ``seen_first``, as an agent that sees one host's ranks tries: all four ranks 4-7 of a
    4-GPU host are its GPUs 0-3): a rank that logged nothing does not shift the others of its
    host onto its GPU. Otherwise (ranks spread over hosts another way) the ranks of a host are
    numbered in rank order.
    """
    rank = ranks["rank"].to_numpy(np.int64)
    host = ranks["host"].to_numpy()
    most = int(pd.Series(host).value_counts().max()) if len(host) else 0
    for n in dict.fromkeys((most, gpus_per_host) if seen_first else (gpus_per_host, most)):
        if n < 1:
            continue
        block = pd.DataFrame({"host": host, "block": rank // n})
        per_host = block.groupby("host")["block"].nunique()
        per_block = block.groupby("block")["host"].nunique()
        if (per_host == 1).all() and (per_block == 1).all():
            return rank % n
    return ranks.groupby("host").cumcount().to_numpy()

