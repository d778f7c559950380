"""A Llama-style decoder in PyTorch over borrowed weights, with its KV cache in pool blocks.

The same architecture as the reference engine's (standby/model/llama_model.h): RMSNorm,
rotate-half RoPE (linear and llama3 scaling), grouped-query attention, SwiGLU MLP, and the LM
head (tied to the embeddings when config.json says so and there is no lm_head.weight). It
computes in fp32 on the CPU. Weights are the tensors of baton_engine.tensors.weight_tensors():
F32 weights are used in place; F16 and BF16 ones are widened to fp32 one matrix at a time,
inside each product, a slice of rows at a time into one small scratch buffer, so no fp32 copy
of the model is ever kept and no product allocates (scratch.py says why that matters).

The KV cache lives in whatever memory `KvBlocks` is given: each pool block holds
`block_tokens` positions of every layer, after a 64-byte header the SDK scrubs for each new
holder, laid out [layer][K | V][kv_head][slot][head_dim] as the reference engine's
PagedKvCache. Single-threaded: one compute thread calls forward().
"""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch

from .scratch import WideningScratch

HEADER_BYTES = 64  # the block header the SDK scrubs (kBlockHeaderBytes)


@dataclass
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def load(cls, model_dir: str) -> "LlamaConfig":
        """config.json of `model_dir`; ValueError naming the field for what is not a Llama
        this engine computes."""
        path = Path(model_dir) / "config.json"
        raw = json.loads(path.read_text())
        if raw.get("model_type", "llama") != "llama":
            raise ValueError(f"{path}: model_type {raw.get('model_type')!r} is not llama")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{path}: hidden_act {raw.get('hidden_act')!r} is not silu")
        for flag in ("attention_bias", "mlp_bias"):
            if raw.get(flag):
                raise ValueError(f"{path}: {flag} is not supported")
        scaling = raw.get("rope_scaling")
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("linear", "llama3"):
                raise ValueError(f"{path}: rope_scaling type {kind!r} (linear or llama3)")
        eos = raw.get("eos_token_id")
        heads = int(raw["num_attention_heads"])
        return cls(hidden_size=int(raw["hidden_size"]),
                   intermediate_size=int(raw["intermediate_size"]),
                   num_attention_heads=heads,
                   num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
                   num_hidden_layers=int(raw["num_hidden_layers"]),
                   vocab_size=int(raw["vocab_size"]),
                   head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                   max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                   rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(raw.get("rope_theta", 10000.0)),
                   rope_scaling=scaling,
                   tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                   bos_token_id=raw.get("bos_token_id"),
                   eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else
                                                         list(eos)))

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4


def inverse_frequencies(c: LlamaConfig) -> torch.Tensor:
    """RoPE's head_dim / 2 frequencies in float64, scaled as the reference engine scales."""
    half = c.head_dim // 2
    out = []
    s = c.rope_scaling or {}
    kind = s.get("rope_type", s.get("type"))
    for i in range(half):
        f = c.rope_theta ** (-2.0 * i / c.head_dim)
        if kind == "linear":
            f /= float(s.get("factor", 1.0))
        elif kind == "llama3":
            factor = float(s.get("factor", 1.0))
            low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
            old = float(s.get("original_max_position_embeddings", 8192))
            wavelen = 2 * math.pi / f
            if wavelen > old / low:
                f /= factor
            elif wavelen >= old / high:
                smooth = (old / wavelen - low) / (high - low)
                f = (1 - smooth) * f / factor + smooth * f
        out.append(f)
    return torch.tensor(out, dtype=torch.float64)


class KvBlocks:
    """The KV cache's blocks: pool block id -> a float32 tensor of shape
    (layers, 2, kv_heads, block_tokens, head_dim) over that block's memory."""

    def __init__(self, config: LlamaConfig, block_bytes: int):
        self.config = config
        self.block_tokens = (block_bytes - HEADER_BYTES) // config.kv_bytes_per_token
        if self.block_tokens < 1:
            raise ValueError(f"a pool block of {block_bytes} bytes holds no token "
                             f"(one needs {config.kv_bytes_per_token + HEADER_BYTES})")
        self.block_tokens = min(self.block_tokens, config.max_position_embeddings)
        self.blocks: dict[int, torch.Tensor] = {}
        self.free: list[int] = []
        self._lock = threading.Lock()  # blocks come and go on another thread than compute's

    def add(self, block: int, memory: torch.Tensor) -> None:
        """Takes a block whose memory is the uint8 tensor `memory` (one pool block)."""
        c = self.config
        floats = c.kv_bytes_per_token // 4 * self.block_tokens
        data = memory[HEADER_BYTES:HEADER_BYTES + floats * 4].view(torch.float32)
        with self._lock:
            self.blocks[block] = data.view(c.num_hidden_layers, 2, c.num_key_value_heads,
                                           self.block_tokens, c.head_dim)
            self.free.append(block)

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
            self.free.extend(blocks)

    def remove_free(self, count: int) -> list[int]:
        """Up to `count` free blocks, removed from the cache (to be returned to the pool)."""
        with self._lock:
            gone, self.free = self.free[:count], self.free[count:]
            for b in gone:
                del self.blocks[b]
            return gone


@dataclass
class Sequence_:
    """One sequence's block table and how many positions are stored."""
    blocks: list[int] = field(default_factory=list)
    length: int = 0


class LlamaModel:
    """forward(kv, seq, tokens): the logits of the last of `tokens`, after storing their K and
    V at positions seq.length.. of `seq`."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, torch.Tensor]):
        self.c = config
        self.w = weights
        self._check()
        self.inv_freq = inverse_frequencies(config)
        self.lm_head = weights.get("lm_head.weight")
        if self.lm_head is None:
            if not config.tie_word_embeddings:
                raise ValueError("model weights: tensor 'lm_head.weight' is missing")
            self.lm_head = weights["model.embed_tokens.weight"]
        narrow = [t for t in weights.values() if t.dtype != torch.float32 and t.dim() == 2]
        self.scratch = WideningScratch(max((t.numel() for t in narrow), default=0),
                                       max((t.shape[1] for t in narrow), default=0))

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

    def _f32(self, name: str) -> torch.Tensor:
        t = self.w[name]
        return t if t.dtype == torch.float32 else t.float()

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.scratch.linear(x, self.w[name])

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.c.rms_norm_eps) * self._f32(name)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: (T, heads, head_dim); rotate-half pairs (i, i + half).
        angles = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos = torch.cos(angles).to(torch.float32)[:, None, :]
        sin = torch.sin(angles).to(torch.float32)[:, None, :]
        half = self.c.head_dim // 2
        x0, x1 = x[..., :half], x[..., half:]
        return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)

    def reserve(self, kv: KvBlocks, seq: Sequence_, length: int) -> None:
        """Blocks for `length` positions in seq's table (MemoryError, nothing taken, if too
        few are free)."""
        need = -(-length // kv.block_tokens) - len(seq.blocks)
        if need > 0:
            seq.blocks.extend(kv.take(need))

    @torch.no_grad()
    def forward(self, kv: KvBlocks, seq: Sequence_, tokens: Sequence[int]) -> torch.Tensor:
        c = self.c
        start, n = seq.length, len(tokens)
        if n == 0:
            raise ValueError("forward: no tokens")
        if start + n > c.max_position_embeddings:
            raise ValueError(f"forward: would pass max_position_embeddings "
                             f"{c.max_position_embeddings}")
        if any(t < 0 or t >= c.vocab_size for t in tokens):
            raise ValueError(f"forward: a token id is outside the vocabulary of {c.vocab_size}")
        self.reserve(kv, seq, start + n)
        ids = torch.tensor(tokens, dtype=torch.long)
        positions = torch.arange(start, start + n)
        x = self.w["model.embed_tokens.weight"][ids].to(torch.float32)
        for layer in range(c.num_hidden_layers):
            x = x + self._attention(kv, seq, layer, x, positions)
            x = x + self._mlp(layer, x)
        last = self._norm(x[-1:], "model.norm.weight")
        seq.length = start + n
        return self.scratch.linear(last, self.lm_head)[0]

    def _attention(self, kv: KvBlocks, seq: Sequence_, layer: int, x: torch.Tensor,
                   positions: torch.Tensor) -> torch.Tensor:
        c, p = self.c, f"model.layers.{layer}."
        hd, heads, kvh = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        h = self._norm(x, p + "input_layernorm.weight")
        q = self._rope(self._linear(h, p + "self_attn.q_proj.weight").view(-1, heads, hd),
                       positions)
        k = self._rope(self._linear(h, p + "self_attn.k_proj.weight").view(-1, kvh, hd),
                       positions)
        v = self._linear(h, p + "self_attn.v_proj.weight").view(-1, kvh, hd)
        bt = kv.block_tokens
        for j, pos in enumerate(positions.tolist()):
            block = kv.blocks[seq.blocks[pos // bt]]
            block[layer, 0, :, pos % bt, :] = k[j]
            block[layer, 1, :, pos % bt, :] = v[j]
        total = int(positions[-1]) + 1
        keys = torch.cat([kv.blocks[b][layer, 0] for b in seq.blocks], dim=1)[:, :total]
        values = torch.cat([kv.blocks[b][layer, 1] for b in seq.blocks], dim=1)[:, :total]
        group = heads // kvh
        keys = keys.repeat_interleave(group, dim=0)      # (heads, total, hd)
        values = values.repeat_interleave(group, dim=0)
        scores = torch.einsum("thd,hsd->hts", q, keys) / math.sqrt(hd)
        mask = torch.arange(total)[None, :] > positions[:, None]  # (T, total): the future
        scores = scores.masked_fill(mask[None], float("-inf"))
        out = torch.einsum("hts,hsd->thd", torch.softmax(scores, dim=-1), values)
        return self._linear(out.reshape(-1, heads * hd), p + "self_attn.o_proj.weight")

    def _mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{layer}."
        h = self._norm(x, p + "post_attention_layernorm.weight")
        gate = torch.nn.functional.silu(self._linear(h, p + "mlp.gate_proj.weight"))
        return self._linear(gate * self._linear(h, p + "mlp.up_proj.weight"),
                            p + "mlp.down_proj.weight")
