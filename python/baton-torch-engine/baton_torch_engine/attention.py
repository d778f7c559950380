"""Attention over the paged KV cache and RoPE, with every row's result independent of the
batch it is computed in.

    rows = StepRows.build(kv, tables, positions, lengths, device)   # once per step
    out = attend(kv_view, layer, q, rows, chunk_blocks, scale)      # (M, heads * head_dim)

A query row at position p attends to positions [0, p] of its own sequence. The keys are read
in chunks of `chunk_blocks` pool blocks (chunk c: positions [c * S, (c + 1) * S)), the same
chunks whether p is decoded alone or in a prefill, and the rows are taken `attention_rows` at
a time, padded: so every product, maximum and exponential has the same shape and the same
operands for the row wherever it comes from. The softmax is merged chunk by chunk in order
(the running maximum m, the running sum l and output o of flash attention):

    m' = max(m, max_j s_j)   p_j = exp(s_j - m')   l' = l exp(m - m') + sum_j p_j
    o' = o exp(m - m') + sum_j p_j v_j

with sum_j p_j taken by the same product as sum_j p_j v_j (a column of ones beside V), so no
reduction over the keys has a shape that depends on the batch. Past p everything is masked:
s_j = -inf, so p_j = 0 exactly, and a chunk wholly past p (a prefill's later rows reach
further) changes nothing: m' = m, exp(0) = 1, l' = l + 0, o' = o + 0. V is zeroed past the
sequence's stored length, where a block holds whatever its last holder left (0 * NaN would be
NaN). fp32 throughout, whatever the KV cache's dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import LlamaConfig, inverse_frequencies

ROPE_CHUNK = 1024  # positions per piece of the RoPE table (always computed in this shape)
ATTENTION_CHUNK = 256  # positions a key chunk covers at least


class RopeTable:
    """cos and sin of every position's RoPE angles in fp32 on the compute device, computed
    once in float64 in pieces of a fixed shape (so a position's values do not depend on how
    many are computed with it); rotate-half pairs (i, i + head_dim / 2)."""

    def __init__(self, config: LlamaConfig, device: torch.device):
        inv = inverse_frequencies(config)
        count = -(-config.max_position_embeddings // ROPE_CHUNK) * ROPE_CHUNK
        cos, sin = [], []
        for first in range(0, count, ROPE_CHUNK):
            pos = torch.arange(first, first + ROPE_CHUNK, dtype=torch.float64)
            angles = pos[:, None] * inv[None, :]
            cos.append(torch.cos(angles).to(torch.float32))
            sin.append(torch.sin(angles).to(torch.float32))
        self.cos = torch.cat(cos).to(device)
        self.sin = torch.cat(sin).to(device)

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (T, heads, head_dim) fp32 at `positions` (T,)."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half], x[..., half:]
        return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)


@dataclass
class StepRows:
    """One step's query rows, padded to whole tiles of `tile` rows: each row's position, its
    sequence's length after the step, and its sequence's block table (region indices, padded
    with the sequence's first block). Padding rows attend to position 0 of the first row's
    sequence; their results are dropped."""
    count: int
    tile: int
    positions: torch.Tensor   # (padded,) long
    lengths: torch.Tensor     # (padded,) long
    tables: torch.Tensor      # (padded, table_width) long
    chunks: list[int]         # key chunks each tile reads

    @classmethod
    def build(cls, tables: list[list[int]], positions: list[int], lengths: list[int],
              tile: int, per_chunk: int, block_tokens: int,
              device: torch.device) -> "StepRows":
        """tables[r], positions[r], lengths[r] for each row r; key chunks of `per_chunk`
        blocks of `block_tokens` positions."""
        count, span = len(positions), per_chunk * block_tokens
        padded = -(-count // tile) * tile
        positions = positions + [0] * (padded - count)
        lengths = lengths + [1] * (padded - count)
        tables = tables + [tables[0][:1]] * (padded - count)
        chunks = [max(positions[r:r + tile]) // span + 1 for r in range(0, padded, tile)]
        width = max(chunks) * per_chunk
        rows = [t[:width] + [t[0]] * (width - len(t[:width])) for t in tables]
        to = dict(dtype=torch.long, device=device)
        return cls(count, tile, torch.tensor(positions, **to), torch.tensor(lengths, **to),
                   torch.tensor(rows, **to), chunks)


def chunk_blocks(block_tokens: int) -> int:
    """Blocks per key chunk: enough for ATTENTION_CHUNK positions."""
    return max(1, -(-ATTENTION_CHUNK // block_tokens))


def attend(view: torch.Tensor, layer: int, q: torch.Tensor, rows: StepRows,
           blocks_per_chunk: int) -> torch.Tensor:
    """q: (M, heads, head_dim) fp32 -> (M, heads * head_dim) fp32, each row over its own
    sequence's keys [0, position]."""
    m, heads, d = q.shape
    keys, values = view[:, layer, 0], view[:, layer, 1]  # (blocks, kv_heads, bt, d)
    kvh, bt = keys.shape[1], keys.shape[2]
    group, span = heads // kvh, blocks_per_chunk * bt
    padded = rows.positions.shape[0]
    qp = q.new_zeros((padded, heads, d))
    qp[:m] = q
    scale = 1.0 / math.sqrt(d)
    out = []
    for i, chunks in enumerate(rows.chunks):
        r = slice(i * rows.tile, (i + 1) * rows.tile)
        out.append(_attend_tile(keys, values, qp[r].reshape(rows.tile * kvh, group, d),
                                rows.positions[r], rows.lengths[r], rows.tables[r], chunks,
                                blocks_per_chunk, span, scale))
    return torch.cat(out)[:m].reshape(m, heads * d)


def _gather(memory: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The chunk's blocks of each row: (tile, kv_heads, span, d) in fp32."""
    g = memory[blocks]  # (tile, blocks_per_chunk, kv_heads, bt, d)
    t, n, kvh, bt, d = g.shape
    return g.permute(0, 2, 1, 3, 4).reshape(t, kvh, n * bt, d).float()


def _attend_tile(keys, values, q, positions, lengths, tables, chunks, per, span, scale):
    tile = positions.shape[0]
    kvh, d = keys.shape[1], keys.shape[3]
    group = q.shape[1]
    top = torch.full((tile, kvh, group), float("-inf"), device=q.device)
    total = q.new_zeros((tile, kvh, group))
    acc = q.new_zeros((tile, kvh, group, d))
    offsets = torch.arange(span, device=q.device)
    for c in range(chunks):
        blocks = tables[:, c * per:(c + 1) * per]
        k = _gather(keys, blocks).reshape(tile * kvh, span, d)
        v = _gather(values, blocks)
        at = c * span + offsets
        seen = (at[None, :] <= positions[:, None])[:, None, None, :]   # (tile, 1, 1, span)
        stored = (at[None, :] < lengths[:, None])[:, None, :, None]    # (tile, 1, span, 1)
        s = torch.bmm(q, k.transpose(1, 2)).view(tile, kvh, group, span) * scale
        s = s.masked_fill(~seen, float("-inf"))
        new_top = torch.maximum(top, s.amax(-1))
        p = torch.exp(s - new_top[..., None])
        scaled = torch.exp(top - new_top)
        va = q.new_empty((tile, kvh, span, d + 1))
        va[..., :d] = v.masked_fill(~stored, 0.0)
        va[..., d] = 1.0
        pv = torch.bmm(p.view(tile * kvh, group, span),
                       va.view(tile * kvh, span, d + 1)).view(tile, kvh, group, d + 1)
        acc = acc * scaled[..., None] + pv[..., :d]
        total = total * scaled + pv[..., d]
        top = new_top
    return (acc / total[..., None]).reshape(tile, kvh * group, d)
