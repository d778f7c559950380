"""A standby's rehearsal: what its promotion and its first request run, done once on its own
memory before it waits for the promotion. The code they need is then mapped again after
baton_engine.libmaps.drop_library_pages, and a model that cannot compute fails as a standby,
not as a newly promoted primary."""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Mapping

import torch
from baton_engine.tensors import bytes_tensor

from .llama import KvBlocks, LlamaConfig, LlamaModel, Sequence_
from .sampler import sample_token


def rehearse(config: LlamaConfig, weights: Mapping[str, torch.Tensor], block_bytes: int) -> None:
    """Takes one private block of `block_bytes` as PoolKv.take takes a granted one, runs one
    decode step of the model's first layer and its head over `weights` (no copy), and samples
    its logits greedily and at a temperature. Writes only memory of its own, which it frees:
    the pool is not touched (a standby maps nothing writable). ValueError or MemoryError when
    the model cannot run."""
    one_layer = dataclasses.replace(config, num_hidden_layers=1)
    model = LlamaModel(one_layer, weights)
    memory = (ctypes.c_uint8 * block_bytes)()
    kv = KvBlocks(one_layer, block_bytes)
    rows = bytes_tensor(ctypes.addressof(memory), block_bytes).view(1, block_bytes)
    kv.add(0, rows[0])
    logits = model.forward(kv, Sequence_(), [config.bos_token_id or 0]).tolist()
    sample_token(logits, 0.0, 1.0, 0, 1)
    sample_token(logits, 0.7, 0.9, 1, 1)
