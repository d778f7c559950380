"""What an engine gives back for a RECLAIM (baton_engine.h): whole chunks of the pool, as the
SDK's TakeWholeChunks walks them. On a device pool the controller lends a block to another
engine only once every block of its chunk is returned, so a RECLAIM is answered in chunks.
"""
from __future__ import annotations

from typing import Collection


def whole_chunks(free: Collection[int], per_chunk: int, pool_blocks: int, want: int) -> list[int]:
    """Up to `want` of the `free` blocks, sorted, in whole chunks of `per_chunk` blocks of a
    pool of `pool_blocks` (its last chunk may be shorter), taken from the highest: a chunk
    goes only when every block of it is free, and only while it fits in what is left."""
    per = max(1, per_chunk)
    end, left, gone = pool_blocks, want, []
    while end > 0 and left > 0:
        first = (end - 1) // per * per
        if end - first <= left and all(b in free for b in range(first, end)):
            gone.extend(range(first, end))
            left -= end - first
        end = first
    return sorted(gone)
