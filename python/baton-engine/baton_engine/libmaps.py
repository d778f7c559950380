"""Shorter deaths for engines that load large shared libraries (PyTorch, CUDA, NCCL).

The controller learns that a killed engine is gone when the kernel has torn its address space
down and closed its sockets. Part of that teardown is one page-table entry for every page of
a shared library the process has touched, and importing PyTorch touches over 100 MiB of them
(its static initializers run across libtorch) that a serving engine never uses again.
`drop_library_pages` removes those entries: the pages stay in the page cache, and the next
access maps them again from it, as if they had never been touched.

Only entries that are exactly the file's bytes are dropped: private, read-only mappings of
files the dynamic linker loaded (a file with an executable mapping) that hold no page of
their own (smaps `Anonymous: 0`: no relocation, no breakpoint). A RELRO segment, written by the
loader before it became read-only, keeps its pages; so does every other mapping (the
controller's weights and pool, model files, heaps, stacks).
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

MADV_DONTNEED = 4

_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)\s*(.*)$")


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/self/smaps with the fields drop_library_pages reads."""
    start: int
    end: int
    perms: str
    inode: int
    path: str
    rss_kib: int = 0
    anonymous_kib: int = 0


@dataclass(frozen=True)
class Dropped:
    """What drop_library_pages dropped: how many mappings, and how much resident memory they
    had (KiB)."""
    mappings: int
    kib: int


def parse_smaps(lines: Iterable[str]) -> Iterator[Mapping]:
    """The mappings of an smaps text, in order. ValueError on a field line before any
    header."""
    current: dict | None = None
    for line in lines:
        m = _HEADER.match(line)
        if m:
            if current is not None:
                yield Mapping(**current)
            current = dict(start=int(m[1], 16), end=int(m[2], 16), perms=m[3],
                           inode=int(m[4]), path=m[5].strip())
            continue
        key, _, rest = line.partition(":")
        if key not in ("Rss", "Anonymous"):
            continue
        if current is None:
            raise ValueError(f"smaps field before any mapping: {line!r}")
        current["rss_kib" if key == "Rss" else "anonymous_kib"] = int(rest.split()[0])
    if current is not None:
        yield Mapping(**current)


def droppable(mappings: list[Mapping]) -> list[Mapping]:
    """The mappings whose pages are exactly their file's: private, read-only, no page of their
    own, resident, of a file that has an executable mapping (a loaded ELF object)."""
    loaded = {m.path for m in mappings if m.inode and m.perms[2] == "x"}
    return [m for m in mappings
            if m.inode and m.path in loaded and m.perms[3] == "p" and m.perms[1] != "w"
            and m.anonymous_kib == 0 and m.rss_kib > 0]


def drop_library_pages(smaps_path: str = "/proc/self/smaps") -> Dropped:
    """Drops this process's page-table entries for the untouched-since-load pages of its shared
    libraries (see the module's docstring). Call it once the engine is warm and idle, as a
    standby before it waits for its promotion; it is safe at any time the dynamic linker is
    not relocating a library on another thread. OSError when smaps cannot be read; a mapping
    the kernel refuses to advise is left as it is."""
    with open(smaps_path) as f:
        mappings = list(parse_smaps(f))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    count = kib = 0
    for m in droppable(mappings):
        if libc.madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            count += 1
            kib += m.rss_kib
    return Dropped(mappings=count, kib=kib)
