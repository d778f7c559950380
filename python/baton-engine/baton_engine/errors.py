"""Exceptions carrying the SDK's reasons: each failed C call becomes a BatonError whose `code`
is the baton::StatusCode it returned and whose message is baton_engine_last_error()."""
from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    """base/status.h's StatusCode, the values the C ABI returns."""
    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    ALREADY_EXISTS = 3
    FAILED_PRECONDITION = 4
    RESOURCE_EXHAUSTED = 5
    UNAVAILABLE = 6
    DATA_LOSS = 7
    DEADLINE_EXCEEDED = 8
    UNIMPLEMENTED = 9
    INTERNAL = 10
    IO_ERROR = 11


class BatonError(Exception):
    """A call into the SDK failed. `code` is its StatusCode, `call` the C function, `reason`
    the SDK's message."""

    def __init__(self, code: int, call: str, reason: str):
        try:
            self.code = StatusCode(code)
        except ValueError:
            self.code = StatusCode.INTERNAL
        self.call = call
        self.reason = reason
        super().__init__(f"{call}: {self.code.name.lower()}: {reason}")


class InvalidArgument(BatonError):
    """A malformed argument (a bad flag, a negative timeout)."""


class NotFound(BatonError):
    """A named thing does not exist (a tensor, device memory on a host controller)."""


class FailedPrecondition(BatonError):
    """Refused in the current state: told to stop, fenced, a stale epoch, already promoted."""


class Unavailable(BatonError):
    """The controller is not there (gone, restarting, or not yet reachable)."""


class DeadlineExceeded(BatonError):
    """A wait ran out before what it waited for came."""


_BY_CODE = {
    StatusCode.INVALID_ARGUMENT: InvalidArgument,
    StatusCode.NOT_FOUND: NotFound,
    StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    StatusCode.UNAVAILABLE: Unavailable,
    StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def error_for(code: int, call: str, reason: str) -> BatonError:
    """The most specific BatonError subclass for `code`."""
    cls = _BY_CODE.get(code, BatonError) if code in StatusCode._value2member_map_ else BatonError
    return cls(code, call, reason)
