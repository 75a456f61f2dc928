"""Batch commands ask glibc's malloc to keep freed memory for reuse (``holmes_ml._malloc``);
the agent and the service do not, and ``HOLMES_MALLOC=default`` turns it off. Each case runs
in a fresh interpreter: the setting is the process's, for good."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="mallopt's thresholds are glibc's")

_PROBE = """
from typer.testing import CliRunner
from holmes_ml import _malloc
from holmes_ml.bench.record import machine_info
from holmes_ml.cli import app
result = CliRunner().invoke(app, [{command!r}, "--help"])
assert result.exit_code == 0, result.output
print(_malloc._KEPT[0], machine_info()["malloc"], sep="|")
"""


def _probe(command: str, **env: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(command=command)],
                         capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, **env}).stdout.strip().splitlines()[-1]
    kept, said = out.split("|")
    return kept, said


@pytest.mark.parametrize("command", ["localize", "bench", "train"])
def test_a_batch_command_keeps_freed_memory_and_a_bench_records_it(command):
    assert _probe(command) == (
        "True", "keeps freed memory (mmap threshold 32 MiB, trim threshold 1024 MiB)")


@pytest.mark.parametrize("command", ["agent", "serve"])
def test_the_agent_and_the_service_give_freed_memory_back(command):
    assert _probe(command) == ("False", "the C library's default")


def test_holmes_malloc_default_leaves_malloc_as_it_is():
    assert _probe("localize", HOLMES_MALLOC="default") == ("False", "the C library's default")
