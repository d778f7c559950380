"""The demo model's architecture in PyTorch, and its files.

The architecture both engines run (standby/model/llama_model.h, and the PyTorch engine's
llama.py): RMSNorm, rotate-half RoPE with frequencies computed in float64 and cos/sin rounded
to float32, grouped-query attention, a SwiGLU MLP and an untied LM head, under Hugging Face's
tensor names, over baton-mkmodel's byte vocabulary (ids 0..255 are the bytes, 256 bos,
257 eos, 258 pad, 259 reserved). Its files are the ones baton-mkmodel writes: config.json and
one safetensors file with the tensors in the same order, the header padded with spaces so the
data starts 8-aligned. This forward pass computes a whole window at once; the engines compute
token by token over a KV cache, so their logits agree with it to rounding, not to the bit.
"""
from __future__ import annotations

import json
import math
import struct

BOS, EOS, PAD, VOCAB = 256, 257, 258, 260

# 0.85 M parameters: 3.4 MB in float32.
ARCH = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=4, max_position_embeddings=384, rms_norm_eps=1e-5,
            rope_theta=10000.0)


def build_model(torch):
    """The model, its weights drawn from torch's global generator (seed it first)."""
    nn, F = torch.nn, torch.nn.functional
    a = ARCH
    h, heads, kv_heads = a["hidden_size"], a["num_attention_heads"], a["num_key_value_heads"]
    hd = h // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a["rms_norm_eps"]) * \
                self.weight

    def rope_tables(length):
        inv = torch.tensor([a["rope_theta"] ** (-2.0 * i / hd) for i in range(hd // 2)],
                           dtype=torch.float64)
        angles = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
        return torch.cos(angles).float(), torch.sin(angles).float()

    def rope(x, cos, sin):  # x: (B, heads, T, hd); rotate-half pairs (i, i + hd/2)
        x0, x1 = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(h, heads * hd, bias=False)
            self.k_proj = nn.Linear(h, kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(h, kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(heads * hd, h, bias=False)

        def forward(self, x, cos, sin, mask):
            b, t, _ = x.shape
            q = rope(self.q_proj(x).view(b, t, heads, hd).transpose(1, 2), cos, sin)
            k = rope(self.k_proj(x).view(b, t, kv_heads, hd).transpose(1, 2), cos, sin)
            v = self.v_proj(x).view(b, t, kv_heads, hd).transpose(1, 2)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            out = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
            return self.o_proj(out.transpose(1, 2).reshape(b, t, heads * hd))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            i = a["intermediate_size"]
            self.gate_proj = nn.Linear(h, i, bias=False)
            self.up_proj = nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.mlp = Mlp()

        def forward(self, x, cos, sin, mask):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(VOCAB, h)
            self.layers = nn.ModuleList(Layer() for _ in range(a["num_hidden_layers"]))
            self.norm = RMSNorm()

    class CausalLm(nn.Module):
        """forward(ids (B, T)) -> logits (B, T, VOCAB), positions 0..T-1."""

        def __init__(self):
            super().__init__()
            self.model = Decoder()
            self.lm_head = nn.Linear(h, VOCAB, bias=False)
            cos, sin = rope_tables(a["max_position_embeddings"])
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, ids):
            t = ids.shape[1]
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            cos, sin = self.cos[:t], self.sin[:t]
            x = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                x = layer(x, cos, sin, mask)
            return self.lm_head(self.model.norm(x))

    model = CausalLm()
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * a["num_hidden_layers"]) \
                if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            torch.nn.init.normal_(p, 0.0, std)
    return model


def tensor_names() -> list[str]:
    """baton-mkmodel's order: embed, each layer, final norm, lm_head."""
    names = ["model.embed_tokens.weight"]
    for n in range(ARCH["num_hidden_layers"]):
        p = f"model.layers.{n}."
        names += [p + s for s in ("input_layernorm.weight", "self_attn.q_proj.weight",
                                  "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                  "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                  "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight")]
    return names + ["model.norm.weight", "lm_head.weight"]


def safetensors_bytes(torch, model, dtype: str = "f32") -> bytes:
    """The model as one safetensors file (F32 or BF16, little-endian)."""
    state = model.state_dict()
    if sorted(tensor_names()) != sorted(state):
        raise AssertionError(f"tensor names differ: {sorted(set(tensor_names()) ^ set(state))}")
    header, chunks, offset = {}, [], 0
    for name in tensor_names():
        t = state[name].detach().contiguous()
        if dtype == "bf16":
            raw = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            raw = t.to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32",
                        "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def config_json(dtype: str, provenance: dict) -> str:
    """config.json: the Llama fields both engines read, and `provenance` under "baton"."""
    a = ARCH
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": a["hidden_size"], "intermediate_size": a["intermediate_size"],
        "num_attention_heads": a["num_attention_heads"],
        "num_key_value_heads": a["num_key_value_heads"],
        "num_hidden_layers": a["num_hidden_layers"],
        "head_dim": a["hidden_size"] // a["num_attention_heads"], "vocab_size": VOCAB,
        "rms_norm_eps": a["rms_norm_eps"], "rope_theta": a["rope_theta"],
        "max_position_embeddings": a["max_position_embeddings"], "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "bfloat16" if dtype == "bf16" else "float32",
        "tie_word_embeddings": False, "bos_token_id": BOS, "eos_token_id": EOS,
        "pad_token_id": PAD, "baton": provenance,
    }
    return json.dumps(config, indent=2) + "\n"


def load_model(torch, model_dir: str):
    """The model of `model_dir` (written by safetensors_bytes), for evaluation."""
    with open(f"{model_dir}/model.safetensors", "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    model = build_model(torch)
    state = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        if entry["dtype"] == "F32":
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        else:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.int16) \
                .view(torch.bfloat16).float()
        state[name] = t.reshape(entry["shape"])
    model.load_state_dict(state)
    return model.eval()


def greedy(torch, model, prompt: bytes, tokens: int) -> tuple[list[int], list[float]]:
    """The greedy continuation of bos + `prompt`, and each step's margin: the top logit less
    the runner-up."""
    ids, out, margins = [BOS] + list(prompt), [], []
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(torch.tensor([ids]))[0, -1]
            top = torch.topk(logits, 2)
            out.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(out[-1])
    return out, margins
