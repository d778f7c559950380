"""A standby's rehearsal: what its promotion and its first request run, done once on its own
memory, on the compute thread, before it waits for the promotion. The code they need is then
mapped again after baton_engine.libmaps.drop_library_pages; on CUDA every kernel a step
launches has been loaded, the compute thread's BLAS handle made and its workspace allocated
(a step's shapes are the same whatever the batch, device.py); and a model that cannot compute
fails as a standby, not as a newly promoted primary."""
from __future__ import annotations

from .kv_blocks import KvBlocks, SequenceBlocks
from .llama import LlamaModel
from .sampler import sample_token


def rehearse(model: LlamaModel, block_bytes: int) -> None:
    """Runs one decode step of the model's first layer and its head on one private block of
    `block_bytes` (the pool's block size) of this process's own memory on the model's device,
    and samples its logits greedily and at a temperature. The pool is not touched (a standby
    maps nothing writable). ValueError or MemoryError when the model cannot run."""
    c = model.c
    kv = KvBlocks.private(c, block_bytes, 1, model.kv_dtype, model.device.torch)
    logits = model.step(kv, [(SequenceBlocks(), [c.bos_token_id or 0])], layers=1)[0].tolist()
    sample_token(logits, 0.0, 1.0, 0, 1)
    sample_token(logits, 0.7, 0.9, 1, 1)
    model.device.synchronize()
