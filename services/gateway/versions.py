"""Which versions of each model are serving now, so cache keys never cross into a version that is gone.

Versions come from the model service's ModelMetadata (polled; through the mesh each poll may reach
another replica or subset) and from the `model_version` of every answer. A version not seen for
`ttl_s` is dropped, and its cached answers are no longer looked up.
"""

from __future__ import annotations

import time


class ServingVersions:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._seen: dict[str, dict[str, float]] = {}

    def saw(self, model: str, version: str, now: float | None = None) -> None:
        if version:
            self._seen.setdefault(model, {})[version] = time.monotonic() if now is None else now

    def current(self, model: str, now: float | None = None) -> list[str]:
        """Serving versions, newest first (numeric versions by number)."""
        now = time.monotonic() if now is None else now
        seen = self._seen.get(model, {})
        live = [v for v, t in seen.items() if now - t <= self.ttl_s]
        for gone in set(seen) - set(live):
            del seen[gone]
        return sorted(live, key=lambda v: (v.isdigit(), int(v) if v.isdigit() else 0, v), reverse=True)
