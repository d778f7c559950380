"""KV records: what the engine leaves in every pool block a keyed sequence fills, in the
reference engine's format (standby/kv/kv_record.h), so that a successor that inherits the
block (a failover) continues the sequence from its KV instead of prefilling it again, and the
controller's accounting and tooling read them alike.

A block's first KvDataOffset(block_tokens) bytes (in host pool memory: on CUDA the host pool
block of the same number, beside the device block that holds the KV) are

    [0, 64)            the header: magic, commit, identity, key (hi, lo), writer epoch, block,
                       previous block, index, tokens, CRC32C, reserved (little-endian)
    [64, data_offset)  the token ids of the block's slots, int32, rounded up to 64 bytes

The header is a seqlock: the stable fields (identity, key, block, previous block, index) are
written first, then the commit counter goes odd, the epoch, token count, CRC32C over
[identity, crc) and the ids (computed before) and the ids are written, then the magic, and
the counter goes even. A record is committed only after the step whose K and V it claims has
written them.

Pure functions over memory addresses; the caller serializes the writers of one block.
"""
from __future__ import annotations

import ctypes
import enum
import itertools
import operator
import struct
from dataclasses import dataclass, field

from baton_engine import crc32c

MAGIC = 0x31564B42  # "BKV1"
NO_BLOCK = 0xFFFFFFFF
HEADER_BYTES = 64
_HEADER = struct.Struct("<IIQQQQIIIIII")
_CRC_BEGIN, _CRC_END = 8, 56  # offsetof(identity), offsetof(crc)
assert _HEADER.size == HEADER_BYTES
_KEY_HI_WORD, _KEY_LO_WORD = 2, 3  # the key's u64 halves among a header's eight words


def present(headers: bytes) -> list[int]:
    """The indices of the whole 64-byte headers in `headers` whose key is not zero: the ones
    read() does not find ABSENT. Found without a Python step per header (a dead engine's
    quarantine may be tens of thousands of blocks with a few records among them)."""
    n = len(headers) // HEADER_BYTES
    if n == 0:
        return []
    words = memoryview(headers)[:n * HEADER_BYTES].cast("B").cast("Q")
    per = HEADER_BYTES // 8
    return list(itertools.compress(range(n), map(operator.or_, words[_KEY_HI_WORD::per],
                                                 words[_KEY_LO_WORD::per])))


def data_offset(block_tokens: int) -> int:
    """Bytes from a block's start to its KV data."""
    return HEADER_BYTES + (block_tokens * 4 + 63) // 64 * 64


def block_tokens_for(block_bytes: int, kv_bytes_per_token: int) -> int:
    """The most slots (with their ids) a block of `block_bytes` holds; 0 when none fits."""
    if kv_bytes_per_token <= 0 or block_bytes <= HEADER_BYTES:
        return 0
    tokens = min((block_bytes - HEADER_BYTES) // (kv_bytes_per_token + 4), 1 << 20)
    while tokens > 0 and data_offset(tokens) + tokens * kv_bytes_per_token > block_bytes:
        tokens -= 1
    return tokens


def identity_of(description: str) -> int:
    """A 64-bit identity of a model and KV layout from its description (FNV-1a)."""
    h = 0xCBF29CE484222325
    for c in description.encode():
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass
class Record:
    identity: int = 0
    key: tuple[int, int] = (0, 0)
    writer_epoch: int = 0
    block: int = 0
    prev_block: int = NO_BLOCK
    index: int = 0
    tokens: int = 0


class State(enum.Enum):
    ABSENT = "absent"    # no record (a zero key)
    TORN = "torn"        # the writer died mid-commit
    CORRUPT = "corrupt"  # a checksum or a field does not hold
    VALID = "valid"


@dataclass
class Read:
    state: State
    record: Record
    ids: list[int] = field(default_factory=list)


def _put(address: int, data: bytes) -> None:
    """Copies `data` to `address` holding the GIL (ctypes.memmove, a foreign call, lets it go,
    and another thread may then run for milliseconds inside a commit's window)."""
    (ctypes.c_char * len(data)).from_address(address)[:] = data


def commit(address: int, r: Record, ids) -> None:
    """Writes record `r` and the ids of its slots (len(ids) == r.tokens) into the block at
    `address`. Everything is computed before the counter goes odd and nothing inside the
    window lets the GIL go, so that a kill leaves a record torn only inside a few copies."""
    ids_bytes = struct.pack(f"<{len(ids)}i", *ids)
    image = _HEADER.pack(MAGIC, 0, r.identity, r.key[0], r.key[1], r.writer_epoch, r.block,
                         r.prev_block, r.index, len(ids), 0, 0)
    crc = crc32c(ids_bytes, crc32c(image[_CRC_BEGIN:_CRC_END]))
    tail = image[32:_CRC_END] + struct.pack("<I", crc) + image[_CRC_END + 4:]  # epoch .. end
    counter = ctypes.c_uint32.from_address(address + 4)
    _put(address + 8, image[8:32])  # the stable fields: identity, key,
    _put(address + 40, image[40:52])  # block, previous block, index
    before = counter.value & ~1
    counter.value = (before + 1) & 0xFFFFFFFF
    _put(address + 32, tail)  # epoch, (stable), tokens, CRC32C
    if ids_bytes:
        _put(address + HEADER_BYTES, ids_bytes)
    _put(address, image[:4])  # the magic
    counter.value = (before + 2) & 0xFFFFFFFF


def clear(address: int) -> None:
    """Zeroes the header: the block holds no record (it goes back to the free list)."""
    ctypes.memset(address, 0, HEADER_BYTES)


def read(header: bytes, ids_address: int, block_tokens: int) -> Read:
    """The record of a block from a copy of its header and its id area in memory."""
    (magic, counter, identity, hi, lo, epoch, block, prev, index, tokens, crc,
     _) = _HEADER.unpack(header[:HEADER_BYTES])
    r = Record(identity, (hi, lo), epoch, block, prev, index, tokens)
    if hi == 0 and lo == 0:
        return Read(State.ABSENT, r)
    if counter & 1 or magic != MAGIC:
        return Read(State.TORN, r)
    if tokens == 0 or tokens > block_tokens:
        return Read(State.CORRUPT, r)
    ids_bytes = ctypes.string_at(ids_address, tokens * 4)
    if crc32c(ids_bytes, crc32c(header[_CRC_BEGIN:_CRC_END])) != crc:
        return Read(State.CORRUPT, r)
    return Read(State.VALID, r, list(struct.unpack(f"<{tokens}i", ids_bytes)))
