"""A cached entry and its Redis encoding: times (stored, fresh-until, stale-until), owner labels and value."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEADER = struct.Struct("<BdddHHH")
_FORMAT = 1


@dataclass(slots=True)
class Entry:
    """One cached answer; times are wall-clock (time.time()) so that every replica reads them alike."""

    value: bytes
    pipeline: str
    model_name: str
    model_version: str
    stored_at: float
    fresh_until: float
    stale_until: float

    def fresh(self, now: float) -> bool:
        return now < self.fresh_until

    def alive(self, now: float) -> bool:
        return now < self.stale_until

    def size(self) -> int:
        """Approximate bytes held in memory (value, labels and a fixed overhead)."""
        return len(self.value) + len(self.pipeline) + len(self.model_name) + len(self.model_version) + 200

    def encode(self) -> bytes:
        labels = [s.encode() for s in (self.pipeline, self.model_name, self.model_version)]
        header = _HEADER.pack(_FORMAT, self.stored_at, self.fresh_until, self.stale_until, *map(len, labels))
        return b"".join([header, *labels, self.value])

    @classmethod
    def decode(cls, data: bytes, offset: int = 0) -> Entry | None:
        """The entry at `offset`, or None when the bytes are not an entry of this format (treated as a miss)."""
        if len(data) < offset + _HEADER.size:
            return None
        fmt, stored_at, fresh_until, stale_until, lp, lm, lv = _HEADER.unpack_from(data, offset)
        i = offset + _HEADER.size
        j, k, v = i + lp, i + lp + lm, i + lp + lm + lv
        if fmt != _FORMAT or len(data) < v:
            return None
        pipeline, model_name, model_version = data[i:j].decode(), data[j:k].decode(), data[k:v].decode()
        return cls(data[v:], pipeline, model_name, model_version, stored_at, fresh_until, stale_until)
