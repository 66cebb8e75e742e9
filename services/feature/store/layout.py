"""The Redis key layout of the online store: key names, bucket scores and bucket records.

Every key of a feature set starts with its base, `<prefix><feature set id>:`. For entity kind E with id I:

- `b:E:I`  one sorted set holding every bucket group of E (E's aggregates that share a bucket length B). Each
  group owns a band of scores (its place among E's groups): bucket k = floor(t / B) scores band * BAND + k in
  even bands and band * BAND + BAND - 1 - k (newest first) in odd ones, so the windows of an even band and the
  odd band after it are one contiguous score range. A member is the bucket's score then its record, packed
  little-endian doubles: the event count, the sum of each summed field, the max of each maxed field, zero-padded
  to E's widest group (all of E's members are one size). Only buckets that hold events exist; each band is
  pruned of buckets past its retention as events arrive, and the key lives as long as E's longest-lived group.
- `h:E:I:F:B:k`  a HyperLogLog of the values of field F seen in bucket k.
- `H:E:I:F:B:R:j`  (distinct counts over ROLLUP_MIN_BUCKETS buckets or more) a HyperLogLog of the values of F
  seen in the R buckets jR .. jR + R - 1, R = ceil(sqrt(buckets)). A distinct count is one PFCOUNT over the
  whole blocks inside its window plus the buckets left over at its ends (a union of HyperLogLogs is their
  register-wise maximum, so this equals PFCOUNT over every bucket's key). R is part of the key.
- `l:E:I`  a sorted set of E's most recent event times (score = member = unix seconds), for since_last.

Ids go into keys as they are (an id containing ':' could alias another entity's keys). The demo model was
trained through this layout: a change to it is a new feature set version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LAST_SEEN_KEEP = 256  # event times kept per entity for since_last (older as-of reads fall back to the default)
MIN_LAST_SEEN_TTL_S = 7 * 86400
ROLLUP_MIN_BUCKETS = 12  # distinct counts over this many buckets or more also keep block HyperLogLogs
BAND = 2**38  # score range of one bucket group in its entity's sorted set (> any bucket number: times < 2**37)
MAX_BANDS = 256  # bucket groups an entity may have (scores stay integers Lua prints exactly)


def key_base(prefix: str, set_id: str) -> str:
    """What every key of a feature set starts with."""
    return f"{prefix}{set_id}:"


def bucket_head(base: str, entity: str) -> str:
    """`b:E:` (the entity's sorted set of bucket records is this then its id)."""
    return f"{base}b:{entity}:"


def last_seen_head(base: str, entity: str) -> str:
    """`l:E:` (the entity's sorted set of recent event times is this then its id)."""
    return f"{base}l:{entity}:"


def score(band: int, bucket: int) -> int:
    """A bucket's score in its entity's sorted set: band * BAND + bucket, newest first in odd bands."""
    return band * BAND + (BAND - 1 - bucket if band % 2 else bucket)


@dataclass(frozen=True)
class BucketGroup:
    """The aggregates of one entity kind sharing one bucket length: one band of the entity's sorted set."""

    entity: str
    bucket_s: int
    buckets: int  # most buckets any of its windows spans
    sum_fields: tuple[str, ...]
    max_fields: tuple[str, ...]

    @property
    def width(self) -> int:
        """Doubles in its own record: the count, its sums, its maxima."""
        return 1 + len(self.sum_fields) + len(self.max_fields)

    @property
    def ttl_s(self) -> int:
        """How long its buckets must live past the last event: its longest window and two buckets."""
        return (self.buckets + 2) * self.bucket_s

    @property
    def prune_len(self) -> int:
        """Members its band may hold before ingest prunes the buckets older than its longest window."""
        return 4 * (self.buckets + 2)


@dataclass(frozen=True)
class DistinctGroup:
    """The HyperLogLogs of one entity kind, field and bucket length (`h:` keys, and `H:` blocks when long)."""

    entity: str
    field: str
    bucket_s: int
    buckets: int  # most buckets any of its windows spans

    @property
    def rollup(self) -> int:
        """Buckets a block HyperLogLog covers (`H:` keys), or 1 (none): about sqrt(buckets), fewest keys a window."""
        return math.isqrt(self.buckets - 1) + 1 if self.buckets >= ROLLUP_MIN_BUCKETS else 1

    @property
    def ttl_s(self) -> int:
        """How long a bucket's (and a block's) HyperLogLog lives past its last value."""
        return (self.buckets + 2) * self.bucket_s

    def bucket_parts(self, base: str) -> tuple[str, str]:
        """A bucket key is `head + id + middle + bucket number`: (head, middle)."""
        return f"{base}h:{self.entity}:", f":{self.field}:{self.bucket_s}:"

    def block_parts(self, base: str) -> tuple[str, str]:
        """A block key is `head + id + middle + block number`: (head, middle)."""
        return f"{base}H:{self.entity}:", f":{self.field}:{self.bucket_s}:{self.rollup}:"

    def keys(self, base: str, entity_id: str, first: int, n: int) -> list[str]:
        """The keys whose PFCOUNT is the distinct count over buckets first .. first + n - 1: every bucket's
        HyperLogLog or, with blocks, those of the whole blocks inside the window and of the buckets left over."""
        head, middle = self.bucket_parts(base)
        bucket = f"{head}{entity_id}{middle}"
        r = self.rollup
        lo, hi = -(-first // r), (first + n) // r - 1  # the whole blocks lo .. hi
        if r == 1 or lo > hi:
            return [f"{bucket}{k}" for k in range(first, first + n)]
        head, middle = self.block_parts(base)
        block = f"{head}{entity_id}{middle}"
        return (
            [f"{bucket}{k}" for k in range(first, lo * r)]
            + [f"{block}{j}" for j in range(lo, hi + 1)]
            + [f"{bucket}{k}" for k in range((hi + 1) * r, first + n)]
        )
