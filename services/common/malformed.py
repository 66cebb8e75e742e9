"""Request bodies that do not parse: a deserializer that hands the failure on as a value, and its rate-limited log.

grpc.aio deserializes a request before any interceptor or handler runs, and a deserializer that raises makes
grpc answer UNKNOWN and log a full traceback at ERROR for every such call (a cheap way to flood the logs).
`tolerant` wraps a deserializer so that a body that does not parse becomes a `Malformed` value instead; the
shared interceptor answers it with INVALID_ARGUMENT and reports it through `RateLimitedLog`, one line per
method and interval with the count of those it left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Deserializer = Callable[[bytes], Any]
# Each method logs a malformed body at most once in this many seconds.
LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Malformed:
    """A request body that did not parse: what it should have been, its size and why it failed."""

    message_type: str
    size: int
    error: str

    @property
    def description(self) -> str:
        """What the client is told (nothing of the body itself)."""
        return f"the request body is not a valid {self.message_type}"


def message_type_of(deserializer: Deserializer) -> str:
    """The protobuf message a deserializer makes (`Message.FromString` is bound to its class), or 'message'."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "message"))


def tolerant(deserializer: Deserializer | None) -> Deserializer | None:
    """`deserializer`, returning a Malformed value where it would raise (None stays None: raw bytes)."""
    if deserializer is None:
        return None
    message_type = message_type_of(deserializer)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # whatever a deserializer raises, the body is the caller's fault
            return Malformed(message_type, len(data), f"{type(exc).__name__}: {exc}")

    return deserialize


class RateLimitedLog:
    """At most one warning per key and interval; the next one says how many were left out in between."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> bool:
        """Log `message % args` for `key` unless it logged one within the interval; True when it logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        left_out = self._suppressed.pop(key, 0)
        text = message % args
        if left_out:
            log.warning("%s (and %d more since the last such line)", text, left_out)
        else:
            log.warning("%s", text)
        return True
