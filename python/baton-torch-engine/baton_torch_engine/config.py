"""LlamaConfig: a model's config.json as baton_torch_engine computes it, and RoPE's
frequencies scaled as the reference engine scales them (standby/model/llama_config.h).
Plain values."""
from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

# A Llama's config.json is a few KiB; anything near this is not one.
MAX_CONFIG_BYTES = 16 << 20


def _read_small_file(path: Path) -> str:
    """The text of `path`, refused (ValueError) when it is not a regular file (a FIFO is not
    waited on) or is over MAX_CONFIG_BYTES, as the reference engine refuses it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: the model config is not a regular file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{path}: the model config is {st.st_size} bytes, over the limit "
                             f"of {MAX_CONFIG_BYTES}")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read().decode()
    finally:
        if fd >= 0:
            os.close(fd)


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
        raw = json.loads(_read_small_file(path))
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
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        if any(isinstance(t, bool) or not isinstance(t, int) or
               not 0 <= t < int(raw["vocab_size"]) for t in eos_ids):
            raise ValueError(f"{path}: eos_token_id {eos!r} is not a token id of the "
                             f"vocabulary of {raw['vocab_size']}")
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
                   eos_token_ids=eos_ids)

    @property
    def kv_bytes_per_token(self) -> int:
        """One position's K and V of every layer in fp32 (the reference engine's layout)."""
        return self.kv_token_bytes(4)

    def kv_token_bytes(self, element_bytes: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * \
            element_bytes


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
