"""load.heap: malloc keeps freed memory, trim() gives it back, and
malloc_figures() tells in-use from kept (glibc, as on every CI machine)."""

from __future__ import annotations

import ctypes

import pytest

from load import heap

pytestmark = pytest.mark.skipif(heap._LIBC is None or not hasattr(heap._LIBC, "mallinfo2"),
                                reason="not glibc >= 2.33: malloc_trim/mallinfo2 missing")


def test_freed_heap_memory_is_kept_until_trimmed():
    libc = heap._LIBC
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    heap.trim()
    base = heap.malloc_figures()
    # 200 MB in 64 KB blocks: under the mmap threshold, so they live in the
    # heap; touched so they are resident.
    blocks = [libc.malloc(64 << 10) for _ in range(3200)]
    for b in blocks:
        libc.memset(b, 1, 64 << 10)
    held = heap.malloc_figures()
    rss_held = heap.rss_mb()
    assert held["in_use_mb"] - base["in_use_mb"] > 190, (base, held)
    # Free all but every 16th: the survivors pin the heap, as live objects
    # do in a long run, so malloc cannot shrink it from the top.
    survivors = blocks[15::16]
    for i, b in enumerate(blocks):
        if i % 16 != 15:
            libc.free(b)
    try:
        freed = heap.malloc_figures()
        assert freed["in_use_mb"] - base["in_use_mb"] < 25, (base, freed)
        assert freed["free_mb"] > 150, freed  # kept by malloc
        rss_kept = heap.rss_mb()
        assert rss_held - rss_kept < 30, (rss_held, rss_kept)  # ... and resident
        assert heap.trim() is True
        rss_trimmed = heap.rss_mb()
        assert rss_kept - rss_trimmed > 120, (rss_held, rss_kept, rss_trimmed)
    finally:
        for b in survivors:
            libc.free(b)
