"""The torch engine's KV cache in the pool blocks the controller grants: on the CPU the host
pool, on CUDA the device pool (the engine connected with use_device_memory), each wrapped as
one tensor (baton_engine.tensors host_block_region / device_block_region, no copy) that the
KvBlocks view indexes by block. A RECLAIM is answered with free blocks only, in whole chunks
of the device pool (one block each on the host), which leave the cache before they are
returned."""
from __future__ import annotations

from typing import Collection

from baton_engine import Extent
from baton_engine.tensors import device_block_region, host_block_region

from . import kv_record
from .generation import Generator
from .llama import LlamaModel


class PoolKv:
    def __init__(self, engine, model: LlamaModel):
        self.engine, self.model = engine, model
        pool = engine.pool()
        self.block_bytes, self.pool_blocks, self.base = pool.block_bytes, pool.block_count, \
            pool.base
        self.blocks = model.new_kv(self.block_bytes)
        self.blocks.reachable = self.pool_blocks  # a canary's share is a part of it
        self.per_chunk = 1
        if model.device.is_cuda:
            self.per_chunk = max(1, engine.device_pool().chunk_bytes // self.block_bytes)
        else:
            self.blocks.set_region(host_block_region(engine), 0)

    def block_address(self, block: int) -> int:
        """Where block `block`'s record lies: its host pool block (on CUDA too, beside the
        device block that holds its KV), mapped while this engine holds the block."""
        return self.base + block * self.block_bytes

    def take(self, extents, held: Collection[int] = ()) -> None:
        """Adds granted blocks, those in `held` as held by adopted sequences (on CUDA the
        region grows down to the lowest one first)."""
        granted = [e.first + i for e in extents for i in range(e.count)]
        if not granted:
            return
        if self.model.device.is_cuda:
            lowest = min(granted + list(self.blocks.blocks))
            if not self.blocks.covers(lowest):
                self.blocks.set_region(device_block_region(self.engine, lowest), lowest)
        held = set(held)
        for b in granted:
            self.blocks.add(b, held=b in held)

    def give(self, count: int) -> list[Extent]:
        """Up to `count` free blocks, in whole chunks, removed from the cache."""
        gone = self.blocks.remove_free(count, self.per_chunk, self.pool_blocks)
        out: list[Extent] = []
        for b in gone:
            if out and out[-1].first + out[-1].count == b:
                out[-1] = Extent(first=out[-1].first, count=out[-1].count + 1)
            else:
                out.append(Extent(first=b, count=1))
        return out

    def generator(self, **options) -> Generator:
        return Generator(self.model, self.blocks, self.model.c.eos_token_ids,
                         may_compute=self.engine.may_write, **options)

    def identity(self, kv_format: str) -> int:
        """The identity of this engine's KV records: the format name, the model's shape and
        weights as the session maps them, the KV dtype and the block geometry (a successor
        adopts only records of its own identity)."""
        c, kv = self.model.c, self.blocks
        parts = [kv_format, f"layers={c.num_hidden_layers}", f"kv_heads={c.num_key_value_heads}",
                 f"head_dim={c.head_dim}", f"block_tokens={kv.block_tokens}",
                 f"block_bytes={self.block_bytes}", f"data_offset={kv.data_offset}",
                 f"dtype={kv.dtype}", f"hidden={c.hidden_size}",
                 f"heads={c.num_attention_heads}", f"rope_theta={c.rope_theta}",
                 f"eps={c.rms_norm_eps}"]
        parts += [f"{t.name}:{t.dtype}:{t.nbytes}" for t in self.engine.tensors()]
        return kv_record.identity_of("|".join(parts))
