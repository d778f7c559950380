"""Engine: one engine's session with the Baton controller, over libbaton_engine.so.

    from baton_engine import tensors
    with Engine.connect(engine_version="my-engine/1") as engine:   # a half-started standby
        weights = tensors.weight_tensors(engine)  # {name: tensor} over the arena, no copy
        try:
            promoted = engine.wait_promotion()    # blocks until this engine is the primary
        except FailedPrecondition:                # told to stop first: a clean exit
            sys.exit(0)
        engine.mark_serving()
        for event in engine.events():       # grants, reclaims, drains, resume; ends at STOP
            ...

The SDK's own thread sends the heartbeats; nothing here has to. Every method is thread-safe
except close(), which must be the last call (the context manager makes it so). A failed call
raises a BatonError subclass (errors.py) carrying the SDK's code and reason.
"""
from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Sequence

from . import _abi
from .errors import BatonError, FailedPrecondition, StatusCode, error_for

# weightcache/safetensors/dtype.h values, by their safetensors names.
DTYPE_NAMES = {1: "F64", 2: "F32", 3: "F16", 4: "BF16", 5: "I64", 6: "I32", 7: "I16", 8: "I8",
               9: "U8", 10: "BOOL", 11: "F8_E4M3", 12: "F8_E5M2"}

_FOREVER = -1


class EventKind(enum.IntEnum):
    """baton_event_kind."""
    NONE = 0
    PROMOTED = 1
    GRANTED = 2
    RECLAIM = 3
    DRAIN = 4
    STOP = 5
    DISCONNECTED = 6
    RESUME = 7
    CONTROLLER_LOST = 8
    CONTROLLER_BACK = 9


@dataclass(frozen=True)
class Extent:
    """Pool blocks [first, first + count) mapped read-write at `address` (`nbytes` long)."""
    first: int
    count: int
    address: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class Event:
    """What the controller asked or told: `extents` for PROMOTED and GRANTED (all of them,
    also past the C event's 64), `blocks` for RECLAIM, `timeout_ms` for DRAIN, `reason` for
    STOP, DISCONNECTED and CONTROLLER_*. `headers` (PROMOTED, GRANTED): HEADER_BYTES per block
    of `extents`, in order, as the block's previous holder left them before the SDK scrubbed
    them (empty for blocks nobody held): what a KV-warm successor reads its records from.
    `successor` (DRAIN): a next primary follows, so keyed requests may be handed over to it;
    False when none does (`batonctl drain`): finish every request."""
    kind: EventKind
    epoch: int
    extents: tuple[Extent, ...] = ()
    blocks: int = 0
    timeout_ms: int = 0
    reason: str = ""
    headers: bytes = b""
    successor: bool = True


HEADER_BYTES = 64  # the block header the SDK scrubs for each new holder (kBlockHeaderBytes)


class KvInheritMode(enum.IntEnum):
    """How a promoted engine took the KV of its predecessor's quarantined blocks."""
    NONE = _abi.KV_INHERIT_NONE      # nothing committed in them
    COPIED = _abi.KV_INHERIT_COPIED  # copied into its own blocks before the barrier
    WAITED = _abi.KV_INHERIT_WAITED  # adopted in place once granted, after the barrier


@dataclass(frozen=True)
class Quarantine:
    """The predecessor's blocks a promotion before its barrier left in quarantine: `extents`
    mapped READ-ONLY once map_quarantined() has mapped them (address 0 before and once
    released; on a device pool the host block with the record, the KV being at the device
    pool's address + block x block_bytes), their `headers` as of the
    promotion (HEADER_BYTES per block), the barrier's expected remaining time and the longest
    the engine may wait for their grant before mark_serving(). A write of the dying engine may
    still land in them: never trust a read of them that is not checked again afterwards."""
    extents: tuple[Extent, ...] = ()
    headers: bytes = b""
    barrier_estimate_ms: float = 0.0
    wait_limit_ms: int = 0

    @property
    def blocks(self) -> int:
        return sum(e.count for e in self.extents)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the weight arena: read-only memory at `address`, `offset` bytes into the
    arena (and into the device copy of the weights)."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    address: int
    nbytes: int
    offset: int


@dataclass(frozen=True)
class PoolInfo:
    """The KV pool: block b at base + b * block_bytes once granted."""
    block_count: int
    block_bytes: int
    base: int
    reserved_bytes: int
    huge_pages: bool


@dataclass(frozen=True)
class DeviceRegion:
    """A device range of a CUDA-backend controller (CUdeviceptr values)."""
    device: int
    address: int
    nbytes: int
    chunk_bytes: int
    chunks: int


def _ms(timeout_ms: Optional[int]) -> int:
    return _FOREVER if timeout_ms is None else int(timeout_ms)


class Drain:
    """One DRAIN being answered: set `unfinished` to the requests left; leaving the `with`
    block reports it, exactly once, also when the block raised (then every request the
    engine still had counts as unfinished unless it said otherwise)."""

    def __init__(self, engine: "Engine", event: Event):
        self.engine = engine
        self.event = event
        self.unfinished = 0
        self._reported = False

    def report(self) -> None:
        if not self._reported:
            self._reported = True
            self.engine.report_drained(self.unfinished)


class Engine:
    """A connected engine. Make one with Engine.connect()."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p):
        self._lib = lib
        self._handle: Optional[ctypes.c_void_p] = handle

    # --- connecting and closing ------------------------------------------------------------

    @classmethod
    def connect(cls, *, socket_path: Optional[str] = None, launch_token: Optional[str] = None,
                engine_id: int = 0, engine_version: Optional[str] = None,
                http_address: Optional[str] = None, prefault_weights: bool = False,
                connect_timeout_ms: int = 0, use_device_memory: bool = False,
                handles_resume: bool = True, controller_events: bool = False,
                ready_when_waiting: bool = False, lib_path: Optional[str] = None) -> "Engine":
        """Connects, registers and becomes a half-started standby: the weights are mapped
        read-only and the pool reserved when this returns. socket_path, launch_token and
        engine_id default to BATON_SOCKET, BATON_LAUNCH_TOKEN and BATON_ENGINE_ID (what the
        controller puts in the engine's environment). handles_resume: this engine admits
        requests again after a drain is called off (a switch-over whose standby failed).
        ready_when_waiting: the controller counts this engine a ready standby only from its
        first wait_promotion() on, not from here (an engine that builds its model on the
        weights after connecting). Raises BatonError (Unavailable when no controller
        answers)."""
        lib = _abi.load(lib_path)
        opts = _abi.Options(
            socket_path=socket_path.encode() if socket_path else None,
            launch_token=launch_token.encode() if launch_token else None,
            engine_id=engine_id,
            engine_version=engine_version.encode() if engine_version else None,
            http_address=http_address.encode() if http_address else None,
            prefault_weights=1 if prefault_weights else 0,
            connect_timeout_ms=connect_timeout_ms)
        flags = ((_abi.USE_DEVICE_MEMORY if use_device_memory else 0) |
                 (_abi.HANDLES_RESUME if handles_resume else 0) |
                 (_abi.CONTROLLER_EVENTS if controller_events else 0) |
                 (_abi.READY_WHEN_WAITING if ready_when_waiting else 0))
        handle = ctypes.c_void_p()
        rc = lib.baton_engine_connect_flags(ctypes.byref(opts), flags, ctypes.byref(handle))
        if rc != 0:
            raise error_for(rc, "connect", lib.baton_engine_last_error().decode())
        return cls(lib, handle)

    def close(self) -> None:
        """Unmaps everything, closes the connection and frees the handle; idempotent."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._lib.baton_engine_close(handle)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def library_path(self) -> str:
        """The libbaton_engine.so in use (libbaton_torch_alloc.so lies beside it)."""
        return getattr(self._lib, "_baton_path", _abi.LIBRARY)

    def _h(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise FailedPrecondition(StatusCode.FAILED_PRECONDITION, "engine", "closed")
        return self._handle

    def _call(self, name: str, *args) -> None:
        rc = getattr(self._lib, name)(self._h(), *args)
        if rc != 0:
            raise error_for(rc, name.removeprefix("baton_engine_"),
                            self._lib.baton_engine_last_error().decode())

    # --- who this engine is ------------------------------------------------------------------

    @property
    def id(self) -> int:
        return self._lib.baton_engine_id(self._h())

    @property
    def epoch(self) -> int:
        """The epoch of this engine's lease (0 before the promotion)."""
        return self._lib.baton_engine_epoch(self._h())

    def check_epoch(self) -> None:
        """Raises unless this engine may keep writing to its blocks (fenced, told to stop, or
        disconnected: FailedPrecondition or Unavailable with the reason)."""
        self._call("baton_engine_check_epoch")

    def may_write(self) -> bool:
        """check_epoch() as a bool, for a compute loop's per-step test."""
        return self._lib.baton_engine_check_epoch(self._h()) == 0

    # --- the weights ---------------------------------------------------------------------------

    @property
    def weights_base(self) -> int:
        """The address of the read-only weight arena every tensor lies in."""
        return self._lib.baton_engine_weights_base(self._h()) or 0

    def _tensor_info(self, t: _abi.Tensor) -> TensorInfo:
        return TensorInfo(name=t.name.decode(), dtype=DTYPE_NAMES.get(t.dtype, f"#{t.dtype}"),
                          shape=tuple(t.shape[i] for i in range(t.ndim)), address=t.data or 0,
                          nbytes=t.size, offset=(t.data or 0) - self.weights_base)

    def tensors(self) -> list[TensorInfo]:
        """The tensor table, sorted by name: where each tensor is, never a copy of it."""
        out = []
        for i in range(self._lib.baton_engine_tensor_count(self._h())):
            t = _abi.Tensor()
            self._call("baton_engine_tensor", i, ctypes.byref(t))
            out.append(self._tensor_info(t))
        return out

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called `name`; NotFound if the model has none."""
        t = _abi.Tensor()
        self._call("baton_engine_find_tensor", name.encode(), ctypes.byref(t))
        return self._tensor_info(t)

    def device_weights(self) -> DeviceRegion:
        """The controller's device copy of the weights (tensor t at address + t.offset).
        NotFound on a host controller or without use_device_memory."""
        return self._region("baton_engine_device_weights")

    # --- the pool -------------------------------------------------------------------------------

    def pool(self) -> PoolInfo:
        p = _abi.PoolInfo()
        self._call("baton_engine_pool", ctypes.byref(p))
        return PoolInfo(block_count=p.block_count, block_bytes=p.block_bytes, base=p.base or 0,
                        reserved_bytes=p.reserved_bytes, huge_pages=bool(p.huge_pages))

    def device_pool(self) -> DeviceRegion:
        """The device KV pool (block b at address + b * pool().block_bytes)."""
        return self._region("baton_engine_device_pool")

    def _region(self, name: str) -> DeviceRegion:
        r = _abi.DeviceRegion()
        self._call(name, ctypes.byref(r))
        return DeviceRegion(device=r.device, address=r.address, nbytes=r.bytes,
                            chunk_bytes=r.chunk_bytes, chunks=r.chunks)

    def extents(self) -> list[Extent]:
        """Every extent mapped now (the blocks this engine holds)."""
        count = self._lib.baton_engine_extents(self._h(), None, 0)
        buf = (_abi.Extent * max(count, 1))()
        got = self._lib.baton_engine_extents(self._h(), buf, count)
        return [_extent(buf[i]) for i in range(min(got, count))]

    def request_blocks(self, blocks: int) -> None:
        """Asks for `blocks` more; they come as a GRANTED event. FailedPrecondition before
        the promotion (a standby has no lease to grow)."""
        self._call("baton_engine_request_blocks", blocks)

    def return_blocks(self, extents: Sequence[Extent]) -> None:
        """Gives blocks back (an answer to RECLAIM; an empty list answers it with nothing).
        Their memory must not be touched afterwards."""
        buf = (_abi.Extent * max(len(extents), 1))(
            *[_abi.Extent(first=e.first, count=e.count) for e in extents])
        self._call("baton_engine_return_blocks", buf, len(extents))

    # --- promotion and events -----------------------------------------------------------------

    def wait_promotion(self, timeout_ms: Optional[int] = None) -> Event:
        """Blocks until this engine is promoted (None: forever); the PROMOTED event lists the
        blocks it now holds. DeadlineExceeded when the timeout passes; FailedPrecondition when
        told to stop first, or when already promoted (take later events with events())."""
        ev = _abi.Event()
        self._call("baton_engine_wait_promotion", _ms(timeout_ms), ctypes.byref(ev))
        return self._event(ev)

    def mark_serving(self) -> None:
        """Tells the controller this engine serves: the router may send it traffic."""
        self._call("baton_engine_mark_serving")

    def next_event(self, timeout_ms: Optional[int] = None) -> Event:
        """The next event; kind NONE when none came within the timeout."""
        ev = _abi.Event()
        self._call("baton_engine_next_event", _ms(timeout_ms), ctypes.byref(ev))
        return self._event(ev)

    def events(self, poll_ms: int = 200) -> Iterator[Event]:
        """Every event until the session ends: yields each, STOP and DISCONNECTED last."""
        while True:
            event = self.next_event(poll_ms)
            if event.kind == EventKind.NONE:
                continue
            yield event
            if event.kind in (EventKind.STOP, EventKind.DISCONNECTED):
                return

    def _event(self, ev: _abi.Event) -> Event:
        kind = EventKind(ev.kind)
        extents: tuple[Extent, ...] = tuple(_extent(ev.extents[i])
                                             for i in range(ev.extent_count))
        if ev.extents_truncated:
            extents = tuple(self.extents())
        headers = b""
        if kind in (EventKind.PROMOTED, EventKind.GRANTED):
            size = self._lib.baton_engine_event_headers(self._h(), None, 0)
            buf = ctypes.create_string_buffer(max(size, 1))
            got = self._lib.baton_engine_event_headers(self._h(), buf, size)
            headers = buf.raw[:min(size, got)]
        successor = kind != EventKind.DRAIN or \
            self._lib.baton_engine_drain_has_successor(self._h()) == 1
        return Event(kind=kind, epoch=ev.epoch, extents=extents, blocks=ev.blocks,
                     timeout_ms=ev.timeout_ms, reason=ev.reason.decode(errors="replace"),
                     headers=headers, successor=successor)

    # --- KV-warm failover ---------------------------------------------------------------------

    def quarantined(self) -> Quarantine:
        """The blocks the promotion left in quarantine (empty when it waited for the barrier,
        or when this engine was promoted with nothing to inherit)."""
        count = self._lib.baton_engine_quarantined(self._h(), None, 0, None, 0, None, None)
        buf = (_abi.Extent * max(count, 1))()
        estimate, limit = ctypes.c_int64(), ctypes.c_int64()
        got = self._lib.baton_engine_quarantined(self._h(), buf, count, None, 0,
                                                 ctypes.byref(estimate), ctypes.byref(limit))
        extents = tuple(_extent(buf[i]) for i in range(min(got, count)))
        blocks = sum(e.count for e in extents)
        headers = ctypes.create_string_buffer(max(blocks * HEADER_BYTES, 1))
        self._lib.baton_engine_quarantined(self._h(), None, 0, headers, blocks * HEADER_BYTES,
                                           None, None)
        return Quarantine(extents=extents, headers=headers.raw[:blocks * HEADER_BYTES],
                          barrier_estimate_ms=estimate.value / 1e3, wait_limit_ms=limit.value)

    def wait_inherited_blocks(self, timeout_ms: Optional[int]) -> Event:
        """After a promotion with quarantined blocks: waits for their GRANTED event (their
        barrier has passed; with their headers), other events staying queued.
        DeadlineExceeded after the timeout; FailedPrecondition when told to stop; NotFound at
        once when the controller said they will not come."""
        ev = _abi.Event()
        self._call("baton_engine_wait_inherited_blocks", _ms(timeout_ms), ctypes.byref(ev))
        return self._event(ev)

    def map_quarantined(self) -> Quarantine:
        """Maps the quarantined blocks READ-ONLY, for a copy of the KV they hold, and returns
        them with their (host) addresses; on a device pool the device chunks that hold their
        KV too, at their place in device_pool()'s range (tensors.device_block_region).
        FailedPrecondition for blocks granted meanwhile (their barrier passed:
        wait_inherited_blocks has them) and where the driver refuses read-only access."""
        self._call("baton_engine_map_quarantined")
        return self.quarantined()

    def release_quarantined(self) -> None:
        """Unmaps the read-only view of the quarantined blocks not granted yet. On a device
        pool every copy out of them must have finished (torch.cuda.synchronize) first."""
        self._call("baton_engine_release_quarantined")

    def report_kv_adoption(self, adopted: int, tokens: int, dropped: Mapping[str, int],
                           ms: float) -> None:
        """Tells the controller what this engine adopted of its predecessor's KV: `adopted`
        sequences of `tokens` tokens, `dropped` reason -> sequences, `ms` spent."""
        reasons = [r for r, n in dropped.items() if n > 0]
        names = (ctypes.c_char_p * max(len(reasons), 1))(*[r.encode() for r in reasons])
        counts = (ctypes.c_uint32 * max(len(reasons), 1))(*[dropped[r] for r in reasons])
        self._call("baton_engine_report_kv_adoption", adopted, tokens, names, counts,
                   len(reasons), float(ms))

    def report_kv_inheritance(self, mode: KvInheritMode, blocks: int, nbytes: int, ms: float,
                              estimate_ms: float = 0.0) -> None:
        """After a promotion with quarantined blocks: how their KV was taken."""
        self._call("baton_engine_report_kv_inheritance", int(mode), blocks, nbytes, float(ms),
                   float(estimate_ms))

    # --- drains, errors, the controller's absence ---------------------------------------------

    @contextlib.contextmanager
    def drain(self, event: Event) -> Iterator[Drain]:
        """Answers a DRAIN: `with engine.drain(ev) as d: ...finish requests...; d.unfinished
        = n`. The report goes when the block ends, exactly once."""
        d = Drain(self, event)
        try:
            yield d
        finally:
            d.report()

    def report_drained(self, unfinished: int) -> None:
        """Answers a DRAIN (exactly one call per drain; drain() makes it for you).
        FailedPrecondition when no DRAIN is pending (none came, or each is answered)."""
        self._call("baton_engine_report_drained", unfinished)

    def resume_pending(self) -> bool:
        """True from the moment the controller calls a drain off until RESUME is taken."""
        return self._lib.baton_engine_resume_pending(self._h()) == 1

    def report_error(self, message: str, code: int = StatusCode.INTERNAL) -> None:
        """An asynchronous error (a device fault, a corrupt state): the controller fences this
        engine at once and promotes the standby."""
        self._call("baton_engine_report_error", int(code), message.encode())

    def report_progress(self, steps_done: int, work_pending: int) -> None:
        """The compute progress, after every step and when a request is admitted: steps
        finished so far (never going back) and requests admitted and not finished. Sent with
        the heartbeats; the controller fences a primary whose steps stand still while work is
        pending for its compute_stall_timeout_ms (longer than the engine's longest step)."""
        self._lib.baton_engine_report_progress(self._h(), steps_done, work_pending)

    def report_cuda_error(self, cuda_result: int, where: str = "") -> None:
        """A CUDA error seen at `where`: a sticky one is reported and fences this engine (and
        raises BatonError INTERNAL with its description); 0 does nothing."""
        self._call("baton_engine_report_cuda_error", int(cuda_result), where.encode())

    def set_controller_absent(self, timeout_ms: int, stop: bool) -> None:
        """After `timeout_ms` without a controller (0: never), stop (end the session with
        DISCONNECTED) or keep serving."""
        action = _abi.ON_CONTROLLER_ABSENT_STOP if stop else _abi.ON_CONTROLLER_ABSENT_SERVE
        self._call("baton_engine_set_controller_absent", int(timeout_ms), action)

    def register_nccl_comm(self, comm: int, label: str = "") -> None:
        """Watches an ncclComm_t (its address) for asynchronous errors (docs/gpu.md)."""
        self._call("baton_engine_register_nccl_comm", ctypes.c_void_p(comm), label.encode())

    def unregister_nccl_comm(self, comm: int) -> None:
        self._call("baton_engine_unregister_nccl_comm", ctypes.c_void_p(comm))


def _extent(e: _abi.Extent) -> Extent:
    return Extent(first=e.first, count=e.count, address=e.data or 0, nbytes=e.bytes)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return _abi.load()


def crc32c(data, crc: int = 0) -> int:
    """The CRC32C of (the bytes that gave `crc`) followed by `data` (bytes-like, or an
    (address, size) pair of memory): the checksum of a KV record (standby/kv/kv_record.h)."""
    lib = _library()
    if isinstance(data, tuple):
        return lib.baton_engine_crc32c(crc, ctypes.c_void_p(data[0]), data[1])
    buf = (ctypes.c_char * len(data)).from_buffer_copy(data) if data else None
    return lib.baton_engine_crc32c(crc, buf, len(data))


__all__ = ["BatonError", "DeviceRegion", "Drain", "Engine", "Event", "EventKind", "Extent",
           "HEADER_BYTES", "KvInheritMode", "PoolInfo", "Quarantine", "TensorInfo", "crc32c"]
