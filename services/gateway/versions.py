"""Which versions of each model are serving now, so cache keys never cross into a version that is gone.

Versions come from the model service's ModelMetadata (polled by `VersionRefresher`; through the mesh each
poll may reach another replica or subset) and from the `model_version` of every answer. A version not seen
for `ttl_s` is dropped, and its cached answers are no longer looked up. The same poll learns each model's
output shapes, which pipeline metadata and default answers need.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence

from services.gateway.domain import OutputSpec
from services.gateway.upstream import DescribeUpstream
from services.model.api import ModelInfo

log = logging.getLogger(__name__)
METADATA_TIMEOUT_S = 2.0


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


class VersionRefresher:
    """Re-reads the metadata of the pipelines' models every `period_s`: versions into `versions`, each model's
    outputs (without the batch dimension) into `outputs`."""

    def __init__(
        self,
        model: DescribeUpstream,
        models: Iterable[str],
        versions: ServingVersions,
        period_s: float,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.model = model
        self.models = sorted(set(models))
        self.versions = versions
        self.period_s = period_s
        self.metadata = tuple(metadata)
        self.outputs: dict[str, dict[str, OutputSpec]] = {}

    async def refresh(self) -> None:
        """One poll of every model; a model that does not answer keeps what was learnt before."""
        results = await asyncio.gather(
            *(self.model.describe(m, timeout_s=METADATA_TIMEOUT_S, metadata=self.metadata) for m in self.models),
            return_exceptions=True,
        )
        for model, result in zip(self.models, results, strict=True):
            if isinstance(result, BaseException):
                log.debug("metadata of %s not available: %s", model, result)
                continue
            self.learn(model, result)

    def learn(self, model: str, info: ModelInfo) -> None:
        """Keep what a description of `model` says: its ready versions and its outputs."""
        for version in info.versions:
            self.versions.saw(model, version)
        self.outputs[model] = {o.name: OutputSpec(o.datatype, list(o.shape[1:])) for o in info.outputs}

    async def run(self) -> None:
        """Refresh every `period_s` until cancelled."""
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.refresh()
            except Exception:  # never let the refresher die
                log.exception("refreshing model versions failed")
