"""Keep the memory large arrays free for the next ones, in batch commands (glibc only).

Feature extraction and localization allocate and free many arrays of one float per operator
(16 MB each for 2 M operators). glibc's malloc hands such blocks back to the kernel when they
are freed (it maps them on their own, or trims the top of its heap), so the next call maps and
zero-fills the same memory again: in ``HOLMES_MALLOC=default holmes bench features`` the
kernel takes 5-9 % of the CPU time of each repeated call, and the figure swings with it from
run to run. :func:`keep_freed_memory` raises both thresholds, so that freed blocks stay in the
heap for reuse: the resident memory then stays near the peak already reached instead of
falling back between calls. A command that does its big work once gains nothing (its memory
is mapped fresh either way; the bench's first call was slower, ``ops_per_s_first_call``).

That is right for a command that runs and exits (``holmes localize``, ``detect``, ``train``,
``bench``), not for the long-running agent beside a training job, which should give back what
a catch-up on big logs took: the CLI calls it for the batch commands only. ``HOLMES_MALLOC``
set to ``default`` leaves malloc as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap (glibc's largest on 64-bit systems), not mapped
#: on their own and unmapped when freed.
MMAP_THRESHOLD = 32 << 20
#: Free memory at the top of the heap up to this much is kept, not trimmed.
TRIM_THRESHOLD = 1 << 30
#: Whether this process asked for it, and glibc took it.
_KEPT = [False]


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks of up to :data:`MMAP_THRESHOLD` bytes, and up to
    :data:`TRIM_THRESHOLD` bytes of free heap, for reuse; returns whether it took both (False
    on another C library, or with ``HOLMES_MALLOC=default``).

    Setting them also turns off glibc's own adjustment of the thresholds (which raises the
    mapping threshold to the largest block freed so far, up to 32 MiB, and trims the heap
    beyond twice that), as ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` would.
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
    _KEPT[0] = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _KEPT[0]


def setting() -> str:
    """What malloc does with freed memory in this process, as a benchmark records it."""
    if _KEPT[0]:
        return (f"keeps freed memory (mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim "
                f"threshold {TRIM_THRESHOLD >> 20} MiB)")
    return "the C library's default"
