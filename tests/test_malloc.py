"""Batch commands ask glibc's malloc to keep freed memory for reuse (``holmes_ml._malloc``),
and numpy to ask for no huge pages where the kernel would compact memory for them; the agent
and the service do not, and ``HOLMES_MALLOC=default`` turns it off. Each case runs in a fresh
interpreter: the setting is the process's, for good."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys

import pytest

from holmes_ml import _malloc

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="mallopt's thresholds are glibc's")


@functools.cache
def _numpy_huge() -> str:
    """numpy's own choice in a fresh interpreter (NUMPY_MADVISE_HUGEPAGE, the kernel's
    version)."""
    return subprocess.run(
        [sys.executable, "-c",
         "import numpy as np; print(np._core.multiarray._get_madvise_hugepage())"],
        capture_output=True, text=True, check=True, timeout=120).stdout.strip()

_PROBE = """
from typer.testing import CliRunner
from holmes_ml import _malloc
from holmes_ml.bench.record import machine_info
from holmes_ml.cli import app
result = CliRunner().invoke(app, [{command!r}, "--help"])
assert result.exit_code == 0, result.output
import numpy as np
huge = np._core.multiarray._get_madvise_hugepage()
print(_malloc._KEPT[0], huge, machine_info()["malloc"], sep="|")
"""


def _probe(command: str, **env: str) -> tuple[str, str, str]:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(command=command)],
                         capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, **env}).stdout.strip().splitlines()[-1]
    kept, huge, said = out.split("|")
    return kept, huge, said


@pytest.mark.parametrize("command", ["localize", "bench", "train"])
def test_a_batch_command_keeps_freed_memory_and_a_bench_records_it(command):
    kept = "keeps freed memory (no block mapped on its own, the heap never trimmed)"
    if _malloc._defrag_stalls():  # this machine's kernel would compact memory for huge pages
        assert _probe(command) == ("True", "False", kept + "; numpy asks for no huge pages "
                                   "(the kernel would compact memory for them)")
    else:
        assert _probe(command) == ("True", _numpy_huge(), kept)


@pytest.mark.parametrize("command", ["agent", "serve"])
def test_the_agent_and_the_service_give_freed_memory_back(command):
    assert _probe(command) == ("False", _numpy_huge(), "the C library's default")


def test_holmes_malloc_default_leaves_malloc_as_it_is():
    assert _probe("localize", HOLMES_MALLOC="default") == (
        "False", _numpy_huge(), "the C library's default")


@pytest.mark.parametrize("text, stalls", [
    ("always defer defer+madvise [madvise] never\n", True),
    ("[always] defer defer+madvise madvise never\n", True),
    ("always defer [defer+madvise] madvise never\n", True),
    ("always [defer] defer+madvise madvise never\n", False),
    ("always defer defer+madvise madvise [never]\n", False),
    ("", False),
])
def test_which_huge_page_policies_stall_a_first_touch(tmp_path, text, stalls):
    path = tmp_path / "defrag"
    path.write_text(text)
    assert _malloc._defrag_stalls(path) is stalls
    assert _malloc._defrag_stalls(tmp_path / "absent") is False
