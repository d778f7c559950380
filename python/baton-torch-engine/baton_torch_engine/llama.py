"""A Llama-style decoder in PyTorch over borrowed weights, with its KV cache in pool blocks,
computing a batch of sequences per step.

The same architecture as the reference engine's (standby/model/llama_model.h): RMSNorm,
rotate-half RoPE (linear and llama3 scaling), grouped-query attention, SwiGLU MLP, and the LM
head (tied to the embeddings when config.json says so and there is no lm_head.weight).
Weights are used where they lie: baton_engine.tensors' views of the controller's arena on the
CPU, or of its device copy on CUDA (device_weight_tensors).

    model = LlamaModel(config, weights, ComputeDevice.parse("cpu"))
    logits = model.step(kv, [(seq_a, [t]), (seq_b, prompt)])  # fp32 on the CPU, per item

step() stores each item's tokens' K and V at positions seq.length.. of its sequence and
returns the logits of each item's last token. A row's logits do not depend on the other items
of the step nor on how its sequence's tokens were split into steps, bit for bit (device.py,
products.py, attention.py): a prefill of prompt + tokens gives the logits that decoding them
one at a time gave, which is what lossless replay needs.

Precision: on the CPU everything is fp32 (F16 and BF16 weights widened exactly, slice by
slice); on CUDA the products run in the weights' dtype with fp32 accumulation, and the
residual stream, norms, attention and softmax, and the logits are fp32. The KV cache is fp32
on the CPU (the reference engine's layout) and the weights' dtype on CUDA. Single-threaded:
one compute thread calls step().
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch

from .attention import RopeTable, StepRows, attend, chunk_blocks
from .config import LlamaConfig, inverse_frequencies
from .device import ComputeDevice
from .kv_blocks import HEADER_BYTES, KvBlocks, SequenceBlocks
from .products import Products, compute_dtype_of

__all__ = ["HEADER_BYTES", "KvBlocks", "LlamaConfig", "LlamaModel", "SequenceBlocks",
           "inverse_frequencies"]

CPU = ComputeDevice("cpu")


class LlamaModel:
    """step(kv, items): the logits of each item's last token; forward(kv, seq, tokens) for
    one sequence."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, torch.Tensor],
                 device: ComputeDevice = CPU):
        self.c, self.w, self.device = config, weights, device
        self._check()
        self.lm_head = weights.get("lm_head.weight")
        if self.lm_head is None:
            if not config.tie_word_embeddings:
                raise ValueError("model weights: tensor 'lm_head.weight' is missing")
            self.lm_head = weights["model.embed_tokens.weight"]
        self.dtype = compute_dtype_of(device, weights.values())
        self.kv_dtype = self.dtype if device.is_cuda else torch.float32
        self.products = Products(device, weights.values(), self.dtype)
        self.norms = {n: t.float() for n, t in weights.items() if t.dim() == 1}
        self.rope = RopeTable(config, device.torch)

    def _check(self) -> None:
        c = self.c
        h, i, q, kv = c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim, \
            c.num_key_value_heads * c.head_dim
        want = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            want.update({p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (q, h),
                         p + "self_attn.k_proj.weight": (kv, h),
                         p + "self_attn.v_proj.weight": (kv, h),
                         p + "self_attn.o_proj.weight": (h, q),
                         p + "post_attention_layernorm.weight": (h,),
                         p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                         p + "mlp.down_proj.weight": (h, i)})
        for name, shape in want.items():
            t = self.w.get(name)
            if t is None:
                raise ValueError(f"model weights: tensor '{name}' is missing")
            if tuple(t.shape) != shape:
                raise ValueError(f"model weights: tensor '{name}' has shape {list(t.shape)} "
                                 f"but the config needs {list(shape)}")
            if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise ValueError(f"model weights: tensor '{name}' has dtype {t.dtype}")

    @property
    def batch_invariant(self) -> bool:
        return self.device.batch_invariant

    def new_kv(self, block_bytes: int) -> KvBlocks:
        """An empty cache for blocks of `block_bytes` in this model's KV dtype."""
        return KvBlocks(self.c, block_bytes, self.kv_dtype)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w, eps = self.norms[name], self.c.rms_norm_eps
        return self.products.rows(
            lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w, x)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.products.linear(x, self.w[name]).float()

    def reserve(self, kv: KvBlocks, seq: SequenceBlocks, length: int) -> None:
        """Blocks for `length` positions in seq's table (MemoryError, nothing taken, if too
        few are free)."""
        need = kv.blocks_for(length) - len(seq.blocks)
        if need > 0:
            seq.blocks.extend(kv.take(need))

    def forward(self, kv: KvBlocks, seq: SequenceBlocks, tokens: Sequence[int]) -> torch.Tensor:
        """The logits (fp32, on the CPU) of the last of `tokens`, stored after seq's."""
        return self.step(kv, [(seq, tokens)])[0]

    def _validate(self, seq: SequenceBlocks, tokens: Sequence[int]) -> None:
        c = self.c
        if len(tokens) == 0:
            raise ValueError("forward: no tokens")
        if seq.length + len(tokens) > c.max_position_embeddings:
            raise ValueError(f"forward: would pass max_position_embeddings "
                             f"{c.max_position_embeddings}")
        if any(t < 0 or t >= c.vocab_size for t in tokens):
            raise ValueError(f"forward: a token id is outside the vocabulary of {c.vocab_size}")

    @torch.no_grad()
    def step(self, kv: KvBlocks, items: Sequence[tuple[SequenceBlocks, Sequence[int]]],
             want: Optional[Sequence[bool]] = None, layers: Optional[int] = None
             ) -> list[Optional[torch.Tensor]]:
        """Stores every item's tokens (their K and V written on the device when it returns)
        and returns, for each item, the fp32 logits (on the CPU) of its last token, or None
        where want[i] is false (a prefill chunk that does not end its prompt). MemoryError when the cache cannot hold the step (the blocks already
        reserved stay in the sequences' tables); ValueError for bad tokens. `layers` runs
        only the first layers (the standby's rehearsal)."""
        for seq, tokens in items:
            self._validate(seq, tokens)
        for seq, tokens in items:
            self.reserve(kv, seq, seq.length + len(tokens))
        view, first = kv.region()
        dev, bt = self.device.torch, kv.block_tokens
        ids, positions, lengths, tables, last = [], [], [], [], []
        for seq, tokens in items:
            table = [b - first for b in seq.blocks]
            for j, t in enumerate(tokens):
                ids.append(t)
                positions.append(seq.length + j)
                lengths.append(seq.length + len(tokens))
                tables.append(table)
            last.append(len(ids) - 1)
        per = chunk_blocks(bt)
        rows = StepRows.build(tables, positions, lengths, self.device.attention_rows, per, bt,
                              dev)
        at = torch.tensor(positions, dtype=torch.long, device=dev)
        where = torch.tensor([tables[r][p // bt] for r, p in enumerate(positions)],
                             dtype=torch.long, device=dev)
        slot = at % bt
        x = self.w["model.embed_tokens.weight"][torch.tensor(ids, device=dev)].float()
        for layer in range(self.c.num_hidden_layers if layers is None else layers):
            x = x + self._attention(view, layer, x, at, where, slot, rows, per)
            x = x + self._mlp(layer, x)
        wanted = [i for i in range(len(items)) if want is None or want[i]]
        out: list[Optional[torch.Tensor]] = [None] * len(items)
        if wanted:  # .cpu() waits for the step: its K and V are written when it returns
            h = self._norm(x[[last[i] for i in wanted]], "model.norm.weight")
            logits = self.products.logits(h, self.lm_head).cpu()
            for n, i in enumerate(wanted):
                out[i] = logits[n]
        else:  # a prefill chunk's K and V land before the caller commits their records
            self.device.synchronize()
        # Only now: a step that failed (out of device memory in its logits) is taken again
        # from the same length.
        for seq, tokens in items:
            seq.length += len(tokens)
        return out

    def _attention(self, view, layer, x, at, where, slot, rows, per) -> torch.Tensor:
        c, p = self.c, f"model.layers.{layer}."
        hd, heads, kvh = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        h = self._norm(x, p + "input_layernorm.weight")
        q = self.rope.apply(self._linear(h, p + "self_attn.q_proj.weight").view(-1, heads, hd),
                            at)
        k = self.rope.apply(self._linear(h, p + "self_attn.k_proj.weight").view(-1, kvh, hd),
                            at)
        v = self._linear(h, p + "self_attn.v_proj.weight").view(-1, kvh, hd)
        keys, values = view[:, layer, 0], view[:, layer, 1]
        keys[where, :, slot] = k.to(view.dtype)
        values[where, :, slot] = v.to(view.dtype)
        out = attend(view, layer, q, rows, per)
        return self._linear(out, p + "self_attn.o_proj.weight")

    def _mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{layer}."
        h = self._norm(x, p + "post_attention_layernorm.weight")
        gate = self.products.rows(torch.nn.functional.silu,
                                  self._linear(h, p + "mlp.gate_proj.weight"))
        return self._linear(gate * self._linear(h, p + "mlp.up_proj.weight"),
                            p + "mlp.down_proj.weight")
