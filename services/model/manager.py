"""Loads, switches and retires model versions: version policy, atomic switch, drain before unload."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from services.common.errors import InvalidArgument, MeshserveError, NotFound, Unavailable, quoted
from services.model.backends import get_backend
from services.model.backends.base import LoadedModel
from services.model.batcher import THREAD
from services.model.config import ModelConfig
from services.model.faults import DelayedModel
from services.model.repository import ModelRepository, check_name, not_in_repository
from services.model.stats import set_state_metric
from services.model.version import ModelVersion, choose_execution, warm_up

log = logging.getLogger(__name__)

SERVE_MODELS_SETTING = "MESHSERVE_MODEL_SERVE_MODELS"  # ModelSettings.serve_models, named in what callers are told


@dataclass
class VersionStatus:
    state: str  # LOADING, READY, UNLOADING, UNAVAILABLE
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RepositoryEntry:
    """One row of RepositoryIndex: a model version's state, or a model's when no version is known."""

    name: str
    version: str  # empty for a model with no version loaded
    state: str  # LOADING, READY, UNLOADING, UNAVAILABLE
    reason: str = ""


@dataclass
class ModelEntry:
    """Everything known about one model name; `ready` is swapped as a whole, never mutated in place."""

    name: str
    ready: dict[int, ModelVersion] = field(default_factory=dict)
    status: dict[int, VersionStatus] = field(default_factory=dict)
    fingerprints: dict[int, str] = field(default_factory=dict)
    reason: str = ""  # model-level problem (e.g. invalid config)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def newest(self) -> ModelVersion | None:
        return self.ready[max(self.ready)] if self.ready else None


class ModelManager:
    """The set of served models; every public method runs on the event loop.

    Args:
        repository: the model repository on disk.
        drain_timeout_s: how long a retired version's in-flight requests may run before it unloads anyway.
        pinned_versions: per model, the only versions loaded (overrides its version_policy).
        fault_delay_ms: fault injection: every forward takes this much longer.
        inline_max_forward_us: the longest warm-up forward of an `execution: auto` model that runs inline.
        serve_models: the only models of the repository this replica serves (empty: all); the others are never
            read or loaded, so their backends are never imported.

    Example:
        manager = ModelManager(ModelRepository(Path("models")), serve_models=["fraud_mlp"])
        await manager.load_all()  # fraud_mlp only; digits_cnn stays UNAVAILABLE in the index
    """

    def __init__(
        self,
        repository: ModelRepository,
        drain_timeout_s: float = 30.0,
        pinned_versions: dict[str, list[int]] | None = None,
        fault_delay_ms: float = 0.0,
        inline_max_forward_us: int = 1000,
        serve_models: Collection[str] = (),
    ) -> None:
        self.repository = repository
        self.serve_models = frozenset(serve_models)
        self.inline_max_forward_us = inline_max_forward_us
        self.fault_delay_s = fault_delay_ms / 1e3
        self.drain_timeout_s = drain_timeout_s
        self.pinned_versions = {name: sorted(set(vs)) for name, vs in (pinned_versions or {}).items()}
        self.models: dict[str, ModelEntry] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    # -- lookups (hot path) ---------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version to serve a request: the asked one, or the newest ready one."""
        entry = self.models.get(name)
        if entry is None:
            raise self._unknown(name)
        if not version:
            newest = entry.newest
            if newest is None:
                why = entry.reason or "; ".join(f"v{v}: {s.state} {s.reason}" for v, s in entry.status.items())
                raise Unavailable(f"model '{name}' has no ready version ({why or 'not loaded'})")
            return newest
        try:
            number = int(version)
        except ValueError:
            raise NotFound(f"model '{name}' has no version {quoted(version)} (versions are integers)") from None
        mv = entry.ready.get(number)
        if mv is None:
            status = entry.status.get(number)
            if status is not None and status.state == "LOADING":
                raise Unavailable(f"model '{name}' version {number} is still loading")
            ready = ", ".join(str(v) for v in sorted(entry.ready)) or "none"
            raise NotFound(f"model '{name}' has no ready version {number} (ready: {ready})")
        return mv

    def serves(self, name: str) -> bool:
        """Whether this replica serves `name` at all (serve_models empty, or naming it)."""
        return not self.serve_models or name in self.serve_models

    def not_served_reason(self) -> str:
        """Why a model of the repository outside serve_models is not loaded here (RepositoryIndex, errors)."""
        served = ", ".join(sorted(self.serve_models))
        return f"this replica does not serve it ({SERVE_MODELS_SETTING} lists {served})"

    def _not_served(self, name: str) -> NotFound | None:
        """NOT_FOUND for a model of the repository that this replica does not serve (None: it serves it, or the
        repository has no such model); InvalidArgument raised for a name no model can have."""
        check_name(name)
        if self.serves(name) or not self.repository.has_model(name):
            return None
        return NotFound(f"model {quoted(name)} is in the repository, but {self.not_served_reason()}")

    def _require_loadable(self, name: str) -> None:
        """NotFound unless this replica serves `name` and knows it (an entry, or a folder in the repository)."""
        not_served = self._not_served(name)
        if not_served is not None:
            raise not_served
        if name not in self.models and not self.repository.has_model(name):
            raise not_in_repository(name)

    def _unknown(self, name: str) -> NotFound:
        """NOT_FOUND for a model this replica has no entry for: not served here, or not known at all."""
        return self._not_served(name) or NotFound(f"unknown model {quoted(name)}; RepositoryIndex lists the models")

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
            return True
        except MeshserveError:
            return False

    def load_seconds(self) -> dict[str, dict[int, float]]:
        """Model -> ready version -> how long it took to load and warm up (importing its backend included)."""
        return {name: {v: mv.load_s for v, mv in entry.ready.items()} for name, entry in self.models.items()}

    def index(self) -> list[RepositoryEntry]:
        """Every model and version known, plus the repository's models not loaded."""
        rows: list[RepositoryEntry] = []
        names = sorted(set(self.models) | set(self.repository.model_names()))
        for name in names:
            entry = self.models.get(name)
            if entry is None:
                reason = "not loaded" if self.serves(name) else self.not_served_reason()
                rows.append(RepositoryEntry(name, "", "UNAVAILABLE", reason))
                continue
            if not entry.status:
                rows.append(RepositoryEntry(name, "", "UNAVAILABLE", entry.reason or "unloaded"))
            for v in sorted(entry.status):
                st = entry.status[v]
                reason = st.reason or (entry.reason if st.state == "READY" and entry.reason else "")
                rows.append(RepositoryEntry(name, str(v), st.state, reason))
        return rows

    # -- load / unload ---------------------------------------------------------------------------------

    def served_names(self) -> list[str]:
        """What `load_all` loads by default: serve_models when set (a name the repository lacks then fails to load,
        logged), else every model of the repository."""
        return sorted(self.serve_models) if self.serve_models else self.repository.model_names()

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load every model this replica serves (or the given ones); failures are logged, not raised."""
        for name in names or self.served_names():
            try:
                await self.load(name)
            except MeshserveError as exc:
                log.error("model %s failed to load: %s", name, exc)

    def select_versions(self, name: str, config: ModelConfig, available: list[int]) -> list[int]:
        """The versions to serve: the pinned ones present on disk if this replica pins the model (one mesh
        subset per replica), else the model's version_policy."""
        pinned = self.pinned_versions.get(name)
        if pinned is not None:
            return [v for v in sorted(available) if v in pinned]
        return config.version_policy.select(available)

    async def load(self, name: str) -> None:
        """(Re)load a model: new or changed versions load and warm up, then switch in atomically; versions
        that left the policy drain and unload. A broken version never replaces the working ones. A model this
        replica does not serve is NotFound, its config never read."""
        self._require_loadable(name)
        entry = self.models.setdefault(name, ModelEntry(name))
        async with entry.lock:
            try:
                config = self.repository.read_config(name)
            except MeshserveError as exc:
                entry.reason = str(exc)
                log.error("%s", exc)
                raise
            available = self.repository.versions(name)
            desired = self.select_versions(name, config, available)
            if not desired:
                policy = "pinned_versions" if name in self.pinned_versions else "version_policy"
                entry.reason = f"no version folder of '{name}' matches its {policy} (on disk: {available})"
                raise InvalidArgument(entry.reason)
            loaded: dict[int, ModelVersion] = {}
            failures: dict[int, str] = {}
            for version in desired:
                fingerprint = self.repository.fingerprint(name, version)
                if version in entry.ready and entry.fingerprints.get(version) == fingerprint:
                    continue
                previous = entry.status.get(version)
                entry.status[version] = VersionStatus("LOADING")
                set_state_metric(name, version, "LOADING")
                try:
                    loaded[version] = await self._load_version(config, version)
                    entry.fingerprints[version] = fingerprint
                except Exception as exc:
                    why = self.repository.relative(str(exc))  # reasons reach clients: no server paths
                    failures[version] = f"failed to load: {why}"
                    log.error("model %s version %d failed to load: %s", name, version, exc)
                    if version in entry.ready:  # the working copy keeps serving
                        entry.status[version] = previous or VersionStatus("READY")
                        entry.status[version].reason = f"reload failed, still serving the previous copy: {why}"
                        set_state_metric(name, version, "READY")
                    else:
                        entry.status[version] = VersionStatus("UNAVAILABLE", failures[version])
                        set_state_metric(name, version, "UNAVAILABLE")
            old = entry.ready
            if failures:
                new_ready = {**old, **loaded}
            else:
                new_ready = {v: loaded.get(v) or old[v] for v in desired}
            entry.ready = new_ready  # the atomic switch
            for version, mv in loaded.items():
                entry.status[version] = VersionStatus("READY")
                set_state_metric(name, version, "READY")
                log.info("model %s version %d ready (%s)", name, version, mv.model.device)
            entry.reason = ""
            for version, mv in old.items():
                if new_ready.get(version) is not mv:
                    self._retire(entry, version, mv, replaced=version in new_ready)
            if failures:
                summary = "; ".join(f"version {v} {why}" for v, why in failures.items())
                raise InvalidArgument(f"model '{name}': {summary}")

    async def unload(self, name: str) -> None:
        """Stop serving every version of a model; in-flight requests finish first."""
        entry = self.models.get(name)
        if entry is None:
            raise self._unknown(name)
        async with entry.lock:
            old, entry.ready = entry.ready, {}
            entry.fingerprints.clear()
            entry.reason = "unloaded"
            for version, mv in old.items():
                self._retire(entry, version, mv, replaced=False)
        await self.wait_retired()

    async def close(self) -> None:
        """Unload everything (after the server drained)."""
        for name in list(self.models):
            await self.unload(name)

    async def wait_retired(self) -> None:
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    async def _load_version(self, config: ModelConfig, version: int) -> ModelVersion:
        started = time.perf_counter()
        backend = get_backend(config.backend)
        version_dir = self.repository.version_dir(config.name, version)

        def load_and_warm() -> tuple[LoadedModel, int | None]:  # worker thread: never block the loop on disk or compute
            model = backend.load(version_dir, config, version)
            try:
                return model, warm_up(model, config)
            except Exception:
                model.unload()
                raise

        model, forward_ns = await asyncio.to_thread(load_and_warm)
        # A delayed model sleeps in its forward: on worker threads only, whatever the config says.
        execution = (
            THREAD if self.fault_delay_s > 0 else choose_execution(config, forward_ns, self.inline_max_forward_us)
        )

        def settle() -> None:  # worker thread: the backend sizes its threads for where forwards run
            try:
                if model.executes(execution.inline):
                    warm_up(model, config)
            except Exception:
                model.unload()
                raise

        await asyncio.to_thread(settle)
        if self.fault_delay_s > 0:
            log.warning(
                "fault injection: every forward of %s v%d takes %.0f ms longer",
                config.name,
                version,
                self.fault_delay_s * 1e3,
            )
            model = DelayedModel(model, self.fault_delay_s)
        warm = "no warm-up forward" if forward_ns is None else f"warm-up forward {forward_ns / 1e3:.0f} us"
        log.info("%s v%d: forwards run %s (%s)", config.name, version, execution.name, warm)
        return ModelVersion(config, version, model, backend, execution, time.perf_counter() - started)

    def _retire(self, entry: ModelEntry, version: int, mv: ModelVersion, replaced: bool) -> None:
        if not replaced:
            entry.status[version] = VersionStatus("UNLOADING")
            set_state_metric(entry.name, version, "UNLOADING")

        async def retire() -> None:
            drained = await mv.drain(self.drain_timeout_s)
            if not drained:
                log.warning("%s v%d: %d requests still in flight after drain timeout", mv.name, version, mv.inflight)
            await asyncio.to_thread(mv.close)
            if not replaced and version not in entry.ready:
                entry.status.pop(version, None)
                set_state_metric(entry.name, version, None)
            log.info("model %s version %d unloaded%s", mv.name, version, " (replaced)" if replaced else "")

        task = asyncio.get_running_loop().create_task(retire())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
