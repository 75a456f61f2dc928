"""Bandwidth-cap drill: every rank in its own network namespace on a private bridge.

Each rank gets a namespace ``hd<pid>-r<k>`` with a veth pair into a drill-only bridge and an
address from ``10.213.<x>.0/24`` (private to the drill, never routed); ``tc qdisc ... tbf`` caps
the target's veth in both directions. Everything is deleted on exit, also on errors. Needs root
and iproute2 (``ip``, ``tc``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)


def bandwidth_unavailable() -> str:
    """Why the bandwidth drill cannot run here, or ``""`` when it can."""
    if os.geteuid() != 0:
        return "bandwidth drill needs root (network namespaces); not root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "bandwidth drill needs the 'ip' and 'tc' commands (iproute2); not found"
    return ""


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)!r} failed ({proc.returncode}): {proc.stderr.strip()}")


@contextmanager
def namespaces(n: int, target: int, rate: str = "2mbit") -> Iterator[tuple[list[list[str]], str]]:
    """Create ``n`` namespaces, cap ``target``; yield (command prefix per rank, master address)."""
    tag = f"hd{os.getpid() % 100000}"
    subnet = f"10.213.{os.getpid() % 250}"
    bridge = f"{tag}br"
    names = [f"{tag}-r{r}" for r in range(n)]
    made: list[str] = []
    try:
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "link", "set", bridge, "up")
        for r, ns in enumerate(names):
            _run("ip", "netns", "add", ns)
            made.append(ns)
            host_if, ns_if = f"{tag}h{r}", f"{tag}n{r}"
            _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            _run("ip", "link", "set", ns_if, "netns", ns)
            _run("ip", "-n", ns, "link", "set", ns_if, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{subnet}.{r + 1}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "set", host_if, "master", bridge)
            _run("ip", "link", "set", host_if, "up")
        tbf = ["root", "tbf", "rate", rate, "burst", "16kb", "latency", "500ms"]
        _run("tc", "qdisc", "add", "dev", f"{tag}h{target}", *tbf)  # towards the target
        _run("ip", "netns", "exec", names[target], "tc", "qdisc", "add", "dev", "eth0", *tbf)
        yield [["ip", "netns", "exec", ns] for ns in names], f"{subnet}.1"
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
