"""Keep freed array memory in the process for reuse, or give it back (glibc ``mallopt``, ``malloc_trim``).

Why. A training step of the default model at batch 16 x 256 allocates about
150 MB of activations in its forward pass and frees them in its backward. By
default glibc gives every block above a few MB straight back to the operating
system when it is freed (``munmap``, or trimming the top of the heap), so the
next step gets *fresh* pages, and the kernel must fault in and zero each 4 KiB
page on first touch. Measured on the 2-core benchmark VM: about 38,000 page
faults per forward, ~4 us each -- 0.15 s of a 0.65 s step, spent before a
single number was computed.

What. :func:`keep_freed_memory` makes glibc serve every block from its heap,
however large (``M_MMAP_MAX`` 0; by default a block above its mmap threshold,
at most 32 MiB, gets pages of its own, mapped when it is made and unmapped when
it is freed), and turns the heap's trimming off (a trim threshold of -1, as
``mallopt(3)`` documents: free memory at the top of the heap stays mapped,
however much there is). The next step then reuses the same, already-faulted
pages. Peak memory is unchanged -- it is the same arrays -- but the process
keeps its high-water mark instead of shrinking between steps. PyTorch users
get the same effect from jemalloc or tcmalloc. Any size limit is one that a
large model passes: a trace of 256 tokens through a 1.1B-parameter Llama makes
a 67 MB ``attn.head_out`` in every layer, and one with gradients through a
360M-parameter Llama holds 4.7 GB in all. Under the largest finite limits
``mallopt`` takes (blocks above 32 MiB mapped, the heap trimmed past 2 GiB),
each such trace faulted its memory in afresh: the 1.1B trace took 6.2 s of
CPU time instead of 5.1.

Who calls it. Nothing happens on import: the setting belongs to the process,
so the program decides. The ``glassllm`` commands that run the model step
after step (``train``, ``eval``, ``generate``, ``inspect``) call it before they
start, and so do the benchmarks in ``bench/``. A program of your own that
trains with glassllm can do the same, once, at its start::

    from glassllm.heap import keep_freed_memory
    keep_freed_memory()

It does nothing on a C library other than glibc, and nothing when the
environment sets ``GLASSLLM_SYSTEM_MALLOC=1``. It changes settings of the
whole process, so a benchmark that runs PyTorch in the same process measures
PyTorch with them too.

The other way round. A server that keeps results, such as the inspector
with its trace cache, wants the opposite: its memory should be what it keeps
plus the work under way, and no more. There, glibc's default is not enough
either: freed blocks smaller than its mmap threshold stay in the heap, and as
cached traces of different sizes come and go, the free holes add up to
hundreds of megabytes above a full cache within minutes of a class's use.
:func:`release_freed_memory` hands every free page back at once
(``malloc_trim(0)``: a few to a few tens of milliseconds for a heap of
gigabytes); the inspector's server calls it after each computation and
leaves :func:`keep_freed_memory` alone.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_memory", "release_freed_memory", "resident_bytes", "MMAP_MAX", "TRIM_THRESHOLD"]

MMAP_MAX = 0                        # mallopt(M_MMAP_MAX, 0): no block gets an mmap of its own
TRIM_THRESHOLD = -1                 # mallopt(M_TRIM_THRESHOLD, -1): never trim the heap

_M_TRIM_THRESHOLD = -1              # <malloc.h>
_M_MMAP_MAX = -4

_applied: bool | None = None


def _glibc():
    """The C library if it is glibc and the environment does not decline it (``GLASSLLM_SYSTEM_MALLOC``)."""
    if os.environ.get("GLASSLLM_SYSTEM_MALLOC", "") not in ("", "0"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl or macOS have no such symbol  # noqa: B018
        libc.mallopt, libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Apply the two glibc settings once; True when they are in effect."""
    global _applied
    if _applied is None:
        _applied = False
        libc = _glibc()
        if libc is None:
            return _applied
        mallopt = libc.mallopt
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        _applied = bool(mallopt(_M_MMAP_MAX, MMAP_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


def release_freed_memory() -> bool:
    """Give the pages of every free heap block back to the operating system now; True if it could.

    Blocks still in use are untouched, so nothing is lost but the time to fault
    freed pages in again when they are next needed.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    libc.malloc_trim(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident memory now, in bytes (None where ``/proc`` does not tell it)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
