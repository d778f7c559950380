"""KvHandoff: the torch engine's KV-warm failover, as the reference engine's
(standby/kv/kv_handoff.h), over the pool blocks of one engine:

  * as a writer, it commits a record (kv_record.py) into every block a keyed sequence filled
    in a step, after the step (whose logits come back to the CPU only once its K and V are
    written), and clears a block's record before the block is freed;
  * as a successor, adopt() reads the records of the blocks inherited with a promotion or with
    the grant of the predecessor's quarantined blocks (the header copies the SDK took before
    its scrub, the token ids from the blocks) and keeps every sequence whose records are
    complete, valid, of this engine's identity and of an older epoch; anything in doubt is
    dropped, counted by reason ("torn", "corrupt", "identity", "epoch", "not_granted",
    "incomplete", "duplicate"), and its blocks are free like any other;
  * a planned switch-over parks the running keyed sequences (park): their blocks keep their
    records for the next primary, and their requests end with an error the router replays;
  * a request that comes back with the same key (the router's replay) continues from the kept
    KV of the longest prefix of its tokens that the KV holds (continue_from), so only the rest
    is prefilled; kept KV nobody claims within keep_s, or whose blocks the cache needs, is
    freed.

The quarantined blocks of a promotion before the predecessor's barrier are copied out of
(kv_copy.py) or waited for (kv_inherit.py), as the reference engine does.

Thread: the compute thread (adopt() before the scheduler runs a step, or on it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from . import kv_record
from .kv_blocks import KvBlocks, SequenceBlocks

Key = tuple[int, int]


@dataclass
class AdoptionReport:
    adopted: int = 0  # sequences kept
    tokens: int = 0   # tokens whose K and V they hold
    dropped: dict[str, int] = field(default_factory=dict)
    ms: float = 0.0

    def merge(self, more: "AdoptionReport") -> None:
        self.adopted += more.adopted
        self.tokens += more.tokens
        for reason, n in more.dropped.items():
            self.dropped[reason] = self.dropped.get(reason, 0) + n
        self.ms += more.ms

    def summary(self) -> str:
        dropped = sum(self.dropped.values())
        why = ", ".join(f"{r} {n}" for r, n in sorted(self.dropped.items()))
        return (f"adopted {self.adopted} sequences ({self.tokens} tokens), dropped {dropped}"
                f"{f' ({why})' if why else ''} in {self.ms:.2f} ms")


@dataclass
class _Kept:
    seq: SequenceBlocks
    tokens: list[int]
    since: float


@dataclass
class Counters:
    """What /metrics shows (the reference engine's baton_engine_kv_* series)."""
    adopted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    continued: int = 0
    tokens_not_recomputed: int = 0
    kept_freed: dict[str, int] = field(default_factory=dict)
    handed_over: int = 0


class KvHandoff:
    def __init__(self, kv: KvBlocks, identity: int, block_address: Callable[[int], int],
                 epoch: Callable[[], int], keep_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = lambda text: None):
        self.kv, self.identity, self.block_address = kv, identity, block_address
        self.epoch, self.keep_s, self.clock, self.log = epoch, keep_s, clock, log
        self.kept: dict[Key, _Kept] = {}
        self.counters = Counters()

    # --- the writer ------------------------------------------------------------------------

    def _commit_blocks(self, key: Key, seq: SequenceBlocks, tokens: Sequence[int], first: int,
                       last: int, epoch: Optional[int] = None) -> None:
        bt = self.kv.block_tokens
        epoch = self.epoch() if epoch is None else epoch
        for i in range(first, min(last, len(seq.blocks) - 1) + 1):
            start = i * bt
            count = min(bt, seq.length - start)
            if count <= 0:
                break
            record = kv_record.Record(identity=self.identity, key=key, writer_epoch=epoch,
                                      block=seq.blocks[i],
                                      prev_block=kv_record.NO_BLOCK if i == 0
                                      else seq.blocks[i - 1], index=i, tokens=count)
            kv_record.commit(self.block_address(seq.blocks[i]), record,
                             tokens[start:start + count])

    def committed(self, key: Key, seq: SequenceBlocks, tokens: Sequence[int],
                  before: int) -> None:
        """After a step: `seq` holds the K and V of tokens[0, seq.length), and held those of
        tokens[0, before) before it."""
        if key == (0, 0) or seq.length <= before or seq.length > len(tokens):
            return
        bt = self.kv.block_tokens
        self._commit_blocks(key, seq, tokens, before // bt, (seq.length - 1) // bt)

    def releasing(self, seq: SequenceBlocks) -> None:
        """`seq`'s blocks are about to go back to the free list: no record may stay in them."""
        for b in seq.blocks:
            kv_record.clear(self.block_address(b))

    # --- the successor -----------------------------------------------------------------------

    def adopt(self, blocks: Sequence[int], headers: bytes) -> tuple[AdoptionReport, list[int]]:
        """Reads the records of the inherited `blocks` (in order; `headers` holds 64 bytes per
        block, as Event.headers) and keeps the sequences that pass. Returns the report and the
        blocks the kept sequences hold: the caller adds those to the cache as held (before
        continue_from can hand them out) and the rest as free."""
        start = self.clock()
        epoch = self.epoch()
        report, held = AdoptionReport(), []
        for key, chain in self.passing_chains(blocks, headers, report):
            seq = SequenceBlocks([r.record.block for r in chain],
                                 sum(r.record.tokens for r in chain))
            if self.keep(key, seq, [t for r in chain for t in r.ids], report, epoch):
                held.extend(seq.blocks)
        report.ms = (self.clock() - start) * 1e3
        self.count(report)
        return report, held

    def passing_chains(self, blocks: Sequence[int], headers: bytes,
                       report: AdoptionReport) -> list[tuple[Key, list[kv_record.Read]]]:
        """The sequences whose records in `blocks` (their header copies in `headers`, their
        ids read from the blocks) are complete, valid, of this engine's identity and of an
        older epoch, each chain in index order; the others are counted in report.dropped."""
        granted = set(blocks)
        epoch = self.epoch()
        chains: dict[Key, list[kv_record.Read]] = {}
        bad: dict[Key, str] = {}
        h = kv_record.HEADER_BYTES
        for i in kv_record.present(memoryview(headers)[:len(blocks) * h]):  # the rest: none
            b = blocks[i]
            header = headers[i * h:(i + 1) * h]
            r = kv_record.read(header, self.block_address(b) + kv_record.HEADER_BYTES,
                               self.kv.block_tokens)
            if r.state == kv_record.State.ABSENT:
                continue
            key = r.record.key
            reason = ""
            if r.state != kv_record.State.VALID:
                reason = r.state.value
            elif r.record.block != b:
                reason = "corrupt"
            elif r.record.identity != self.identity:
                reason = "identity"
            elif r.record.writer_epoch >= epoch:
                reason = "epoch"
            if reason and key not in bad:
                bad[key] = reason
            chains.setdefault(key, []).append(r)
        passing = []
        for key, chain in chains.items():
            reason = bad.get(key) or self._refusal(chain, granted)
            if reason:
                report.dropped[reason] = report.dropped.get(reason, 0) + 1
                self.log(f"not adopting request {key[0]:016x}{key[1]:016x}: {reason}")
                continue
            passing.append((key, chain))
        return passing

    def count(self, report: AdoptionReport) -> None:
        """Adds an adoption's report to the counters /metrics shows."""
        self.counters.adopted += report.adopted
        for reason, n in report.dropped.items():
            self.counters.dropped[reason] = self.counters.dropped.get(reason, 0) + n

    def _refusal(self, chain: list[kv_record.Read], granted: set[int]) -> str:
        chain.sort(key=lambda r: r.record.index)
        bt = self.kv.block_tokens
        for i, r in enumerate(chain):
            rec = r.record
            if rec.index < i:
                return "corrupt"  # two blocks at one index
            expected = kv_record.NO_BLOCK if i == 0 else chain[i - 1].record.block
            if rec.index > i or rec.prev_block != expected:
                if rec.prev_block != kv_record.NO_BLOCK and rec.prev_block not in granted:
                    return "not_granted"
                return "incomplete" if rec.index > i else "corrupt"
            if i + 1 < len(chain) and rec.tokens != bt:
                return "incomplete"
        return ""

    def keep(self, key: Key, seq: SequenceBlocks, tokens: list[int], report: AdoptionReport,
             epoch: int) -> bool:
        """Keeps `seq` (the K and V of `tokens`) for the replay of `key`, its records committed
        again at `epoch`; False (its records cleared, its blocks the caller's to free) when a
        sequence as long is kept already."""
        old = self.kept.get(key)
        if old is not None:
            if old.seq.length >= seq.length:
                self.releasing(seq)
                # The same sequence found again (a copy taken before the blocks' grant holds
                # it already) is no drop; another as long kept for the key is.
                if old.tokens[:len(tokens)] != tokens:
                    report.dropped["duplicate"] = report.dropped.get("duplicate", 0) + 1
                return False
            self._free_kept(key, "replaced")
        self._commit_blocks(key, seq, tokens, 0, len(seq.blocks) - 1, epoch)
        report.adopted += 1
        report.tokens += seq.length
        self.kept[key] = _Kept(seq, tokens, self.clock())
        return True

    def park(self, key: Key, seq: SequenceBlocks, tokens: Sequence[int]) -> None:
        """A planned switch-over hands a running sequence over: its blocks, whose records are
        committed through seq.length, are kept as they are (the next primary adopts them with
        the promotion; this engine continues from them if the switch-over is called off).
        `seq` is left empty."""
        if key == (0, 0) or seq.length <= 0:
            return
        if key in self.kept:
            self._free_kept(key, "replaced")
        kept = SequenceBlocks(list(seq.blocks), seq.length)
        self.kept[key] = _Kept(kept, list(tokens[:seq.length]), self.clock())
        seq.blocks, seq.length = [], 0
        self.counters.handed_over += 1

    def continue_from(self, key: Key, tokens: Sequence[int], seq: SequenceBlocks) -> int:
        """A (re)admitted request: hands `seq` the kept blocks of the longest prefix of
        `tokens` (all but the last) the kept KV holds; returns how many tokens that is."""
        kept = self.kept.get(key)
        if kept is None or not tokens:
            return 0
        limit = min(len(kept.tokens), len(tokens) - 1)
        use = 0
        while use < limit and kept.tokens[use] == tokens[use]:
            use += 1
        if use == 0:
            self._free_kept(key, "mismatch")
            return 0
        blocks = self.kv.blocks_for(use)
        rest = SequenceBlocks(kept.seq.blocks[blocks:])
        if rest.blocks:
            self.releasing(rest)
            self.kv.give_back(rest.blocks)
        seq.blocks, seq.length = kept.seq.blocks[:blocks], use
        self._commit_blocks(key, seq, tokens, blocks - 1, blocks - 1)  # never claims more
        del self.kept[key]
        self.counters.continued += 1
        self.counters.tokens_not_recomputed += use
        self.log(f"request {key[0]:016x}{key[1]:016x} continues from {use} kept tokens of "
                 f"{len(tokens)}")
        return use

    def evict(self, blocks: int) -> None:
        """Frees the oldest kept sequences until `blocks` blocks are free again."""
        freed = 0
        while freed < blocks and self.kept:
            key = min(self.kept, key=lambda k: self.kept[k].since)
            freed += len(self.kept[key].seq.blocks)
            self._free_kept(key, "evicted")

    def expire(self) -> int:
        """Frees the kept sequences older than keep_s; returns how many."""
        now = self.clock()
        old = [k for k, v in self.kept.items() if now - v.since >= self.keep_s]
        for key in old:
            self._free_kept(key, "expired")
        return len(old)

    def _free_kept(self, key: Key, reason: str) -> None:
        kept = self.kept.pop(key)
        self.releasing(kept.seq)
        self.kv.give_back(kept.seq.blocks)
        self.counters.kept_freed[reason] = self.counters.kept_freed.get(reason, 0) + 1
