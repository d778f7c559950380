"""The C ABI of libbaton_engine.so (standby/sdk/baton_engine.h) declared for ctypes.

Every structure here mirrors its C counterpart field for field; `ABI_VERSION` is the version
these declarations follow, and `load()` refuses a library that implements another.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

ABI_VERSION = 10

USE_DEVICE_MEMORY = 1
HANDLES_RESUME = 2
CONTROLLER_EVENTS = 4
READY_WHEN_WAITING = 8

ON_CONTROLLER_ABSENT_SERVE = 0
ON_CONTROLLER_ABSENT_STOP = 1

KV_INHERIT_NONE = 0
KV_INHERIT_COPIED = 1
KV_INHERIT_WAITED = 2

MAX_EVENT_EXTENTS = 64
EVENT_REASON_BYTES = 256


class Options(ctypes.Structure):
    _fields_ = [("socket_path", ctypes.c_char_p), ("launch_token", ctypes.c_char_p),
                ("engine_id", ctypes.c_uint64), ("engine_version", ctypes.c_char_p),
                ("http_address", ctypes.c_char_p), ("prefault_weights", ctypes.c_int),
                ("connect_timeout_ms", ctypes.c_int)]


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_uint8), ("ndim", ctypes.c_size_t),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p),
                ("size", ctypes.c_uint64)]


class PoolInfo(ctypes.Structure):
    _fields_ = [("block_count", ctypes.c_uint32), ("block_bytes", ctypes.c_uint64),
                ("base", ctypes.c_void_p), ("reserved_bytes", ctypes.c_uint64),
                ("huge_pages", ctypes.c_int)]


class Extent(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint32), ("count", ctypes.c_uint32),
                ("data", ctypes.c_void_p), ("bytes", ctypes.c_uint64)]


class Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("epoch", ctypes.c_uint64),
                ("extent_count", ctypes.c_uint32), ("extents_truncated", ctypes.c_int),
                ("extents", Extent * MAX_EVENT_EXTENTS), ("blocks", ctypes.c_uint32),
                ("timeout_ms", ctypes.c_int64), ("reason", ctypes.c_char * EVENT_REASON_BYTES)]


class DeviceRegion(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("address", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("chunk_bytes", ctypes.c_uint64),
                ("chunks", ctypes.c_uint32)]


_p = ctypes.c_void_p
_i = ctypes.c_int
_u32, _u64, _i64 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64

# name, result type, argument types: every function of baton_engine.h.
_PROTOTYPES = [
    ("baton_engine_abi_version", _i, []),
    ("baton_engine_last_error", ctypes.c_char_p, []),
    ("baton_engine_connect", _i, [ctypes.POINTER(Options), ctypes.POINTER(_p)]),
    ("baton_engine_connect_flags", _i, [ctypes.POINTER(Options), ctypes.c_uint,
                                        ctypes.POINTER(_p)]),
    ("baton_engine_set_controller_absent", _i, [_p, _i64, _i]),
    ("baton_engine_device_weights", _i, [_p, ctypes.POINTER(DeviceRegion)]),
    ("baton_engine_device_pool", _i, [_p, ctypes.POINTER(DeviceRegion)]),
    ("baton_engine_close", None, [_p]),
    ("baton_engine_id", _u64, [_p]),
    ("baton_engine_epoch", _u64, [_p]),
    ("baton_engine_check_epoch", _i, [_p]),
    ("baton_engine_tensor_count", ctypes.c_size_t, [_p]),
    ("baton_engine_tensor", _i, [_p, ctypes.c_size_t, ctypes.POINTER(Tensor)]),
    ("baton_engine_find_tensor", _i, [_p, ctypes.c_char_p, ctypes.POINTER(Tensor)]),
    ("baton_engine_pool", _i, [_p, ctypes.POINTER(PoolInfo)]),
    ("baton_engine_weights_base", _p, [_p]),
    ("baton_engine_wait_promotion", _i, [_p, _i64, ctypes.POINTER(Event)]),
    ("baton_engine_mark_serving", _i, [_p]),
    ("baton_engine_next_event", _i, [_p, _i64, ctypes.POINTER(Event)]),
    ("baton_engine_request_blocks", _i, [_p, _u32]),
    ("baton_engine_return_blocks", _i, [_p, ctypes.POINTER(Extent), ctypes.c_size_t]),
    ("baton_engine_report_drained", _i, [_p, _u32]),
    ("baton_engine_report_progress", _i, [_p, ctypes.c_uint64, _u32]),
    ("baton_engine_resume_pending", _i, [_p]),
    ("baton_engine_drain_has_successor", _i, [_p]),
    ("baton_engine_report_error", _i, [_p, _i, ctypes.c_char_p]),
    ("baton_engine_extents", ctypes.c_size_t, [_p, ctypes.POINTER(Extent), ctypes.c_size_t]),
    ("baton_engine_register_nccl_comm", _i, [_p, _p, ctypes.c_char_p]),
    ("baton_engine_unregister_nccl_comm", _i, [_p, _p]),
    ("baton_engine_report_cuda_error", _i, [_p, _i, ctypes.c_char_p]),
    ("baton_engine_event_headers", ctypes.c_size_t, [_p, _p, ctypes.c_size_t]),
    ("baton_engine_quarantined", ctypes.c_size_t,
     [_p, ctypes.POINTER(Extent), ctypes.c_size_t, _p, ctypes.c_size_t,
      ctypes.POINTER(_i64), ctypes.POINTER(_i64)]),
    ("baton_engine_wait_inherited_blocks", _i, [_p, _i64, ctypes.POINTER(Event)]),
    ("baton_engine_map_quarantined", _i, [_p]),
    ("baton_engine_release_quarantined", _i, [_p]),
    ("baton_engine_report_kv_adoption", _i,
     [_p, _u32, _u64, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_u32), ctypes.c_size_t,
      ctypes.c_double]),
    ("baton_engine_report_kv_inheritance", _i,
     [_p, _i, _u32, _u64, ctypes.c_double, ctypes.c_double]),
    ("baton_engine_crc32c", _u32, [_u32, _p, ctypes.c_size_t]),
]

LIBRARY = "libbaton_engine.so"


def candidates(explicit: Optional[str] = None) -> list[str]:
    """Where load() looks for libbaton_engine.so: only `explicit` (a file or a folder) when
    given; else, in order, $BATON_ENGINE_LIB (a file), $BATON_LIB_DIR (a folder), the build/lib
    of the repository this package lies in, then the dynamic loader's own search
    (LD_LIBRARY_PATH, ld.so.cache)."""
    if explicit:
        path = Path(explicit)
        return [str(path / LIBRARY if path.is_dir() else path)]
    found: list[str] = []
    for given in (os.environ.get("BATON_ENGINE_LIB"), os.environ.get("BATON_LIB_DIR")):
        if given:
            path = Path(given)
            found.append(str(path / LIBRARY if path.is_dir() else path))
    repo_build = Path(__file__).resolve().parents[3] / "build" / "lib" / LIBRARY
    if repo_build.exists():
        found.append(str(repo_build))
    found.append(LIBRARY)
    return found


def load(explicit: Optional[str] = None) -> ctypes.CDLL:
    """libbaton_engine.so with every prototype declared, loaded RTLD_GLOBAL (so that
    libbaton_torch_alloc.so, which PyTorch opens by path, finds it). Raises OSError naming every
    place it looked, or when the library implements another ABI version."""
    errors = []
    for path in candidates(explicit):
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, res, args in _PROTOTYPES:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        version = lib.baton_engine_abi_version()
        if version != ABI_VERSION:
            raise OSError(f"{path} implements ABI {version}; this package speaks {ABI_VERSION}")
        lib._baton_path = path  # type: ignore[attr-defined]
        return lib
    raise OSError("libbaton_engine.so not found (set BATON_LIB_DIR): " + "; ".join(errors))
