"""The reference engine's sampler (standby/model/sampler.h), operation for operation: the
token is a pure function of (logits, temperature, top_p, seed, position), so a request
replayed as prompt + the tokens already sent continues as the interrupted run would have, on
either engine, as long as the two engines' logits agree (a near-tie between two tokens can
fall either way when they differ in the last bits: docs/engines.md).
"""
from __future__ import annotations

import math
import struct
from typing import Sequence

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def sample_uniform(seed: int, position: int) -> float:
    """The uniform number in [0, 1) for (seed, position)."""
    bits = _splitmix64(_splitmix64(seed & _MASK) ^ ((position * 0xD1B54A32D192ED03) & _MASK))
    return (bits >> 11) * 2.0 ** -53


def as_float32(x: float) -> float:
    """`x` rounded to float32, as the reference engine keeps temperature and top_p."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _argmax(logits: Sequence[float]) -> int:
    best, found = 0, False
    for i, v in enumerate(logits):
        if math.isnan(v):
            continue
        if not found or v > logits[best]:
            best = i
        found = True
    return best


def sample_token(logits: Sequence[float], temperature: float, top_p: float, seed: int,
                 position: int) -> int:
    """The chosen id: greedy at temperature 0 (lowest id on a tie), else nucleus sampling
    with one uniform number keyed by (seed, position). `logits` are float32 values."""
    if not logits:
        return 0
    temperature, top_p = as_float32(temperature), as_float32(top_p)
    best = _argmax(logits)
    if not temperature > 0 or not math.isfinite(logits[best]) or not top_p > 0:
        return best
    top = logits[best]
    w = [0.0 if math.isnan(v) else math.exp((v - top) / temperature) for v in logits]
    total = _sum(w)
    if top_p < 1:
        order = sorted(range(len(w)), key=lambda i: -w[i])  # stable: ties by id
        mass, keep = 0.0, 0
        while keep < len(order):
            mass += w[order[keep]]
            keep += 1
            if mass >= top_p * total:
                break
        kept = order[:max(keep, 1)]
    else:
        kept = list(range(len(w)))
    kept_mass = _sum(w[i] for i in kept)
    target = sample_uniform(seed, position) * kept_mass
    cumulative = 0.0
    for i in kept:
        cumulative += w[i]
        if target < cumulative:
            return i
    for i in reversed(kept):
        if w[i] > 0:
            return i
    return best


def _sum(values) -> float:
    """Left-to-right double sum, as std::accumulate adds."""
    s = 0.0
    for v in values:
        s += v
    return s
