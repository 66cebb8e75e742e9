"""The store's generation marker: one never-expiring key that says which life of the online store this is, so that
a store that lost its data (a restart without its append-only file, a FLUSHALL) is noticed and never read silently.

The feature service writes a marker when it first meets a store without one, and reads it again after every
reconnect and periodically. A marker gone after one was seen means the data went with it: a new marker is written
(SET NX, so that replicas that notice together agree on one), carrying the time of the loss, and every row whose
windows reach back before that time is degraded (`features_store_reset`) until the longest window has passed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import numpy as np

MARKER_KEY = "generation"  # after the service's key prefix
RESET_REASON = "features_store_reset"


@dataclass(frozen=True, slots=True)
class Generation:
    """One life of the store. `reset_at`: unix seconds of the data loss it follows (0: none; it began on a store
    that was new, or that held data from before markers existed)."""

    id: str
    started_at: float
    reset_at: float = 0.0

    @classmethod
    def new(cls, now: float, reset_at: float = 0.0) -> Generation:
        return cls(uuid.uuid4().hex, now, reset_at)

    def encode(self) -> str:
        return json.dumps({"id": self.id, "started_at": self.started_at, "reset_at": self.reset_at})

    @classmethod
    def decode(cls, raw: bytes | str | None) -> Generation | None:
        """The marker's value as stored (None: no marker). A value this code did not write still names a
        generation (its text is its id), with no loss."""
        if raw is None:
            return None
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        try:
            fields = json.loads(text)
            return cls(str(fields["id"]), float(fields["started_at"]), float(fields.get("reset_at", 0.0)))
        except (ValueError, TypeError, KeyError):
            return cls(text, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Loss:
    """A loss of the store's data this process learnt of: when, and whether it noticed it itself (else another
    replica wrote the marker that says so)."""

    reset_at: float
    noticed_here: bool


class GenerationWatch:
    """What this process knows of the store's generation; `seen` is fed every marker read and says what to write.

    The decisions, with the marker as read (None: absent):
    - a marker, the one known: nothing changes;
    - a marker, another than the one known (or none known yet): it becomes the known one (so does its `reset_at`:
      rows are marked after a loss whoever noticed it); when one was known and the new one's `reset_at` is later,
      that loss is reported (another replica noticed it first);
    - no marker, none known (a new store, or this process's first look): write a first generation, no loss;
    - no marker, one known: the store lost its data now; write a generation carrying `reset_at = now`.
    A write is SET NX: when another replica's marker won, that one is read back and fed to `seen`.
    """

    def __init__(self) -> None:
        self.current: Generation | None = None
        self.losses: list[Loss] = []  # every loss learnt of, in order (for the metric and the log)

    @property
    def reset_at(self) -> float:
        """Unix seconds of the latest loss known (0: none)."""
        return self.current.reset_at if self.current is not None else 0.0

    def seen(self, stored: Generation | None, now: float) -> Generation | None:
        """Take in the marker as read; the generation to write (SET NX) when there is none, else None."""
        if stored is None:
            return Generation.new(now, reset_at=now if self.current is not None else 0.0)
        known = self.current
        if known is None or stored.id != known.id:
            self.current = stored
            if known is not None and stored.reset_at > known.reset_at:
                self.losses.append(Loss(stored.reset_at, noticed_here=False))
        return None

    def written(self, generation: Generation) -> Loss | None:
        """The generation this process wrote (its SET NX succeeded) is the store's now; the loss it records, if any."""
        self.current = generation
        if generation.reset_at > 0:
            loss = Loss(generation.reset_at, noticed_here=True)
            self.losses.append(loss)
            return loss
        return None


def lookback_s(windows: list[tuple[int, int]], since_last_ttl_s: int) -> int:
    """How far back the aggregates of a feature set read: the longest window plus its bucket (a window is the whole
    buckets before the row's own bucket, so it reaches back up to one bucket more), or the since_last TTL when that
    is longer. `windows`: (window s, bucket s) of each windowed aggregate; `since_last_ttl_s`: 0 when none."""
    return max([since_last_ttl_s, *(w + b for w, b in windows)], default=0)


def reset_rows(ts: np.ndarray, reset_at: float, lookback: int) -> np.ndarray:
    """Which rows (event times `ts`, unix s) read windows that reach back before a loss of the store at `reset_at`:
    those with `ts - lookback < reset_at`. None when no loss is known (`reset_at` 0)."""
    if reset_at <= 0 or lookback <= 0:
        return np.zeros(len(ts), dtype=bool)
    return np.asarray(ts, dtype=np.float64) - lookback < reset_at
