"""The in-process L1: an LRU with per-entry expiry and a byte budget (evictions counted)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from services.cache.entry import Entry


class L1Cache:
    """LRU of Entry by key; `put` evicts least recently used entries until the byte budget holds."""

    def __init__(self, max_bytes: int, max_ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.max_ttl_s = max_ttl_s
        self._entries: OrderedDict[bytes, tuple[Entry, float]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        self.generation = 0  # counts remove_where calls (invalidations): a put may check none came in between

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> Entry | None:
        """The live entry (fresh or stale) and mark it recently used; expired entries are dropped."""
        item = self._entries.get(key)
        if item is None:
            return None
        entry, l1_until = item
        if now >= entry.stale_until or now >= l1_until:
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, entry: Entry, now: float) -> bool:
        """Insert or replace; False when the entry alone exceeds the budget (not cached)."""
        size = entry.size() + len(key)
        if size > self.max_bytes or not entry.alive(now):
            self._remove(key)
            return False
        self._remove(key)
        self._entries[key] = (entry, min(entry.stale_until, now + self.max_ttl_s))
        self.bytes += size
        while self.bytes > self.max_bytes:
            old_key, _ = next(iter(self._entries.items()))
            self._remove(old_key)
            self.evictions += 1
        return True

    def remove_where(self, match: Callable[[Entry], bool]) -> int:
        """Drop every entry `match` accepts; returns how many."""
        self.generation += 1
        doomed = [k for k, (e, _) in self._entries.items() if match(e)]
        for key in doomed:
            self._remove(key)
        return len(doomed)

    def _remove(self, key: bytes) -> None:
        item = self._entries.pop(key, None)
        if item is not None:
            self.bytes -= item[0].size() + len(key)
