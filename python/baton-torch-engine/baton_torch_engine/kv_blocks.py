"""KvBlocks: the KV cache in pool blocks, one typed view over the memory that holds them.

    kv = KvBlocks(config, block_bytes, torch.float32)
    kv.set_region(memory, first)     # uint8 memory of blocks [first, first + n), any device
    kv.add(block)                    # a block of the region this cache may use
    kv.view[kv.index(b)]             # block b: (layers, 2, kv_heads, block_tokens, head_dim)

Each pool block holds `block_tokens` positions of every layer, after a 64-byte header the SDK
scrubs for each new holder and the token ids of its slots (together kv_record.data_offset:
the reference engine's block layout, whose header and ids are the KV record of
kv_record.py), laid out [layer][K | V][kv_head][slot][head_dim] as the reference engine's
PagedKvCache (fp32 on the CPU; the compute dtype on CUDA). The region is one
tensor over contiguous blocks (the whole host pool, a device pool from its lowest held block,
a private buffer), so that a step gathers the blocks it reads by index, with one operation.
Only held blocks are ever read or written: the rest of a pool's range may be unmapped.

Blocks come and go on the engine's event thread while the compute thread runs: the free list
is guarded by a lock; a region is replaced only by a larger one over the same memory, and a
step keeps the view it started with.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from baton_engine.reclaim import whole_chunks

from . import kv_record
from .config import LlamaConfig

HEADER_BYTES = kv_record.HEADER_BYTES  # the block header the SDK scrubs (kBlockHeaderBytes)


@dataclass
class SequenceBlocks:
    """One sequence's block table (pool block ids) and how many positions are stored."""
    blocks: list[int] = field(default_factory=list)
    length: int = 0


class KvBlocks:
    def __init__(self, config: LlamaConfig, block_bytes: int,
                 dtype: torch.dtype = torch.float32):
        self.config, self.block_bytes, self.dtype = config, block_bytes, dtype
        self.element_bytes = torch.tensor([], dtype=dtype).element_size()
        per_token = config.kv_token_bytes(self.element_bytes)
        tokens = kv_record.block_tokens_for(block_bytes, per_token)
        if tokens < 1:
            raise ValueError(f"a pool block of {block_bytes} bytes holds no token "
                             f"(one needs {per_token + 4 + 2 * HEADER_BYTES})")
        if block_bytes % self.element_bytes:
            raise ValueError(f"a pool block of {block_bytes} bytes is not a whole number of "
                             f"{dtype} values")
        self.block_tokens = min(tokens, config.max_position_embeddings)
        self.data_offset = kv_record.data_offset(self.block_tokens)
        self.view: Optional[torch.Tensor] = None
        self.first = 0
        self.region_blocks = 0
        self.blocks: set[int] = set()
        self.free: list[int] = []
        self.peak = 0  # the most blocks the cache held
        self.reachable = 0  # the blocks it may be granted (a pool's), 0 when unknown
        self._lock = threading.Lock()

    @classmethod
    def private(cls, config: LlamaConfig, block_bytes: int, count: int,
                dtype: torch.dtype = torch.float32,
                device: torch.device = torch.device("cpu")) -> "KvBlocks":
        """A cache of `count` blocks of this process's own zeroed memory on `device`."""
        kv = cls(config, block_bytes, dtype)
        kv.set_region(torch.zeros(count * block_bytes, dtype=torch.uint8, device=device), 0)
        for b in range(count):
            kv.add(b)
        return kv

    def region(self) -> tuple[torch.Tensor, int]:
        """The view and the pool block its index 0 is, together (a step keeps both)."""
        with self._lock:
            if self.view is None:
                raise ValueError("the KV cache has no memory yet")
            return self.view, self.first

    def set_region(self, memory: torch.Tensor, first: int) -> None:
        """Takes `memory` (uint8, 1-D, contiguous) as blocks [first, first + n) of the pool."""
        c, e = self.config, self.element_bytes
        count = memory.numel() // self.block_bytes
        flat = memory[:count * self.block_bytes].view(self.dtype)
        bt, d, kvh = self.block_tokens, c.head_dim, c.num_key_value_heads
        view = flat.as_strided(
            (count, c.num_hidden_layers, 2, kvh, bt, d),
            (self.block_bytes // e, 2 * kvh * bt * d, kvh * bt * d, bt * d, d, 1),
            flat.storage_offset() + self.data_offset // e)
        with self._lock:
            self.view, self.first, self.region_blocks = view, first, count
            self._region_memory = memory  # the view's storage, kept alive

    def block_memory(self, block: int) -> torch.Tensor:
        """Block `block` of the region as uint8 memory (its header, ids and KV), no copy."""
        with self._lock:
            if not self.covers(block):
                raise ValueError(f"block {block} is outside the KV region")
            at = (block - self.first) * self.block_bytes
            return self._region_memory[at:at + self.block_bytes]

    def covers(self, block: int) -> bool:
        return self.view is not None and self.first <= block < self.first + self.region_blocks

    def index(self, block: int) -> int:
        """The block's index in `view`."""
        return block - self.first

    def add(self, block: int, held: bool = False) -> None:
        """Takes pool block `block` (inside the region) as a free block of this cache, or as
        one a sequence holds (`held`: adopted KV, which goes back to the free list with
        give_back)."""
        with self._lock:
            if not (self.first <= block < self.first + self.region_blocks):
                raise ValueError(f"block {block} is outside the KV region")
            if block not in self.blocks:
                self.blocks.add(block)
                self.peak = max(self.peak, len(self.blocks))
                if not held:
                    self.free.append(block)

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_tokens)

    @property
    def free_count(self) -> int:
        with self._lock:
            return len(self.free)

    @property
    def total(self) -> int:
        with self._lock:
            return len(self.blocks)

    @property
    def reachable_blocks(self) -> int:
        """The most blocks this cache may hold: the most it held, or `reachable` (a pool
        shared with other engines: blocks may be granted later or come back), as the
        reference engine's PagedKvCache::reachable_blocks."""
        with self._lock:
            return max(self.peak, self.reachable)

    def take(self, count: int) -> list[int]:
        """`count` free blocks, or MemoryError with none taken."""
        with self._lock:
            if count > len(self.free):
                raise MemoryError(f"the KV cache needs {count} more blocks, "
                                  f"{len(self.free)} free")
            taken, self.free = self.free[:count], self.free[count:]
            return taken

    def give_back(self, blocks: Sequence[int]) -> None:
        with self._lock:
            self.free.extend(b for b in blocks if b in self.blocks)

    def remove_free(self, count: int, per_chunk: int = 1, pool_blocks: int = 0) -> list[int]:
        """Up to `count` free blocks removed from the cache (to be returned to the pool), in
        whole chunks of `per_chunk` blocks of a pool of `pool_blocks` (the last chunk may be
        shorter), from the highest, as the SDK's TakeWholeChunks walks them: a chunk goes only
        when every block of it is here and free, and only while it fits in what is left."""
        with self._lock:
            end = pool_blocks or (max(self.blocks) + 1 if self.blocks else 0)
            gone = whole_chunks(set(self.free), per_chunk, end, count)
            taken = set(gone)
            self.free = [b for b in self.free if b not in taken]
            self.blocks -= taken
            return sorted(gone)
