"""The torch engine's KV cache in the pool blocks the controller granted: each granted block
becomes a KvBlocks block through baton_engine.tensors.block_tensor (no copy); a RECLAIM is
answered with free blocks only, which leave the cache before they are returned."""
from __future__ import annotations

from baton_engine import Extent
from baton_engine.tensors import block_tensor

from .generation import Generator
from .llama import KvBlocks, LlamaConfig


class PoolKv:
    def __init__(self, engine, config: LlamaConfig):
        self.engine = engine
        self.block_bytes = engine.pool().block_bytes
        self.blocks = KvBlocks(config, self.block_bytes)
        self.config = config

    def take(self, extents) -> None:
        for e in extents:
            rows = block_tensor(self.engine, e)
            for i in range(e.count):
                if e.first + i not in self.blocks.blocks:
                    self.blocks.add(e.first + i, rows[i])

    def give(self, count: int) -> list[Extent]:
        """Up to `count` free blocks, removed from the cache, as extents of one block."""
        return [Extent(first=b, count=1) for b in self.blocks.remove_free(count)]

    def generator(self, model) -> Generator:
        return Generator(model, self.blocks, self.config.eos_token_ids,
                         may_compute=self.engine.may_write)
