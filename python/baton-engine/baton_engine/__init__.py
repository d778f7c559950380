"""Baton's engine SDK for Python: an engine borrows the controller's weights and KV pool,
waits as a half-started standby, is promoted, fenced, drained and upgraded through it.

A ctypes binding of libbaton_engine.so (standby/sdk/baton_engine.h); no compiler is needed to
install it. `baton_engine.tensors` adds zero-copy PyTorch views where torch is installed.
docs/engines.md shows a whole engine built on it.
"""
from .errors import (BatonError, DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound,
                     StatusCode, Unavailable)
from .session import (HEADER_BYTES, DeviceRegion, Drain, Engine, Event, EventKind, Extent,
                      KvInheritMode, PoolInfo, Quarantine, TensorInfo, crc32c)

__version__ = "0.1.0"

__all__ = ["BatonError", "DeadlineExceeded", "DeviceRegion", "Drain", "Engine", "Event",
           "EventKind", "Extent", "FailedPrecondition", "HEADER_BYTES", "InvalidArgument",
           "KvInheritMode", "NotFound", "PoolInfo", "Quarantine", "StatusCode", "TensorInfo",
           "Unavailable", "crc32c"]
