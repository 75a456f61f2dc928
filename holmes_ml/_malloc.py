"""Keep the memory large arrays free for the next ones, in batch commands (glibc only).

Feature extraction and localization allocate and free many arrays of one float per operator
(16 MB each for 2 M operators). glibc's malloc hands such blocks back to the kernel when they
are freed (it maps each on its own and unmaps it, or trims the top of its heap), so the next
array maps and zero-fills the same memory again. :func:`keep_freed_memory` makes every block
come from the heap and never trims it, so that freed blocks stay there for reuse: the resident
memory then stays at the peak already reached instead of falling back between arrays.

Where the kernel compacts memory synchronously to give a region that asked for huge pages its
first touch (``/sys/kernel/mm/transparent_hugepage/defrag`` set to ``always``, ``madvise`` or
``defer+madvise``; ``madvise`` is the common default), numpy's request for huge pages behind
every array of 4 MB or more (``NUMPY_MADVISE_HUGEPAGE``) can cost more than it saves: on the
2-core machine of ``docs/results.md`` (``madvise``) the kernel took 63-64 % of the CPU time of
a first ``build_features`` call on 2 M or 6 M operators, and 12 % with numpy not asking and
every block from the heap. The function turns that request off too in such a case.

That is right for a command that runs and exits (``holmes localize``, ``detect``, ``train``,
``bench``), not for the long-running agent beside a training job, which should give back what
a catch-up on big logs took: the CLI calls it for the batch commands only. ``HOLMES_MALLOC``
set to ``default`` leaves malloc and numpy as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

import numpy as np

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: The kernel's policy for regions that ask for huge pages.
_DEFRAG = Path("/sys/kernel/mm/transparent_hugepage/defrag")
#: Policies under which a fault in such a region may wait for memory to be compacted.
_STALLS = ("always", "madvise", "defer+madvise")
#: What this process asked for and got: [malloc keeps freed memory, numpy's huge pages off].
_KEPT = [False, False]


def _defrag_stalls(path: Path = _DEFRAG) -> bool:
    """Whether a first touch of memory that asked for huge pages may wait for compaction (the
    policy in brackets in ``path`` is one of :data:`_STALLS`)."""
    try:
        text = path.read_text()
    except OSError:
        return False
    chosen = text[text.find("[") + 1:text.find("]")] if "[" in text else ""
    return chosen in _STALLS


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve every block from its heap and never trim it, so freed
    arrays' memory is reused rather than mapped afresh; returns whether it took both (False on
    another C library, or with ``HOLMES_MALLOC=default``). Where the kernel would compact
    memory on the first touch of a huge-page region (:func:`_defrag_stalls`), numpy is also
    asked to stop requesting huge pages for large arrays.

    Setting them turns off glibc's own adjustment of the thresholds (which maps blocks over the
    largest freed so far, up to 32 MiB, on their own, and trims the heap beyond twice that), as
    ``MALLOC_MMAP_MAX_=0`` and ``MALLOC_TRIM_THRESHOLD_=-1`` would.
    """
    if os.environ.get("HOLMES_MALLOC", "").strip().lower() == "default":
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False  # not glibc (macOS, Windows): its allocator is left as it is
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # -1: never trim (mallopt(3)); 0 mappings: a block of any size comes from the heap
    _KEPT[0] = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, -1))
    core = getattr(np, "_core", None) or getattr(np, "core", None)  # numpy 2, numpy 1
    toggle = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if _KEPT[0] and toggle is not None and _defrag_stalls():
        toggle(False)
        _KEPT[1] = True
    return _KEPT[0]


def setting() -> str:
    """What malloc does with freed memory in this process, as a benchmark records it."""
    if not _KEPT[0]:
        return "the C library's default"
    said = "keeps freed memory (no block mapped on its own, the heap never trimmed)"
    if _KEPT[1]:
        said += "; numpy asks for no huge pages (the kernel would compact memory for them)"
    return said
