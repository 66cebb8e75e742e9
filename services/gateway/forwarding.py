"""Model names that are not pipelines: the public ones (a policy in the gateway's settings) go to the model
service as they came, v2 messages passed through unchanged, the caller's deadline (and, for ModelInfer, its
headers) passed on, errors with their own code; any other is unknown here. Loading and unloading models, which
change what every pipeline answers, pass only for the operator (the gateway's admin token, or a JWT for the operator
subject), and go on to the model service with the model service's own admin token.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection
from typing import TypeVar

import grpc

from services.common import tokens
from services.common.errors import InvalidArgument, MeshserveError, NotFound, error_with_code
from services.common.operator_check import AUTHORIZATION, bearer_credential, permission_denied, same_secret
from services.gateway.activator import Activator, Target
from services.gateway.admission import Admission, Priority
from services.gateway.converters import pipeline_index
from services.gateway.demand import DemandTracker
from services.gateway.joins import PER_REQUEST_HEADERS, routing_headers
from services.gateway.upstream import Deadline, Headers
from services.model.api import ModelClient
from services.protos import inference_pb2 as pb

log = logging.getLogger(__name__)
R = TypeVar("R")
FORWARD_TIMEOUT_S = 30.0  # a forwarded call without a client deadline


def _looks_like_jwt(credential: str) -> bool:
    """A compact JWS has three dot-separated parts (a static token has none)."""
    return credential.count(".") == 2


class Forwarder:
    """The model service's RPCs behind the gateway; `pipelines` are the names it answers for itself, `public` the
    models clients may reach by name. The operator, the only caller that may load or unload, sends `admin_token`
    or a JWT verified against `jwks` (a JWKS document) whose subject is tokens.OPERATOR_SUBJECT (both empty: nobody
    may load or unload through the gateway); the forwarded call carries `model_admin_token` (None: `admin_token`).
    `demand` counts the forwarded ModelInfer calls in flight (for the scaler); `activator` parks them while their model
    has no serving replica (None: one of its own on `demand` and `model`, with the default settings)."""

    def __init__(
        self,
        model: ModelClient,
        admission: Admission,
        pipelines: Collection[str],
        public: Collection[str] = (),
        admin_token: str = "",
        jwks: str = "",
        model_admin_token: str | None = None,
        demand: DemandTracker | None = None,
        activator: Activator | None = None,
    ) -> None:
        self.model = model
        self.admission = admission
        self.pipelines = pipelines
        self.public = public
        self.admin_token = admin_token
        self.jwks = jwks
        self.model_admin_token = model_admin_token
        self.demand = DemandTracker() if demand is None else demand  # model calls in flight, for the scaler
        self.activator = Activator(self.demand, model) if activator is None else activator

    def _reachable(self, name: str) -> None:
        """NotFound for a model that is not public, worded as for a name that does not exist at all."""
        if name not in self.public:
            raise NotFound(f"no pipeline {name!r} here (pipelines: {', '.join(sorted(self.pipelines)) or 'none'})")

    def _operator(self, rpc: str, headers: Headers) -> None:
        """Returns for the operator; PermissionDenied for any other caller, Unauthenticated for a JWT that does not
        verify. Refusals say which credential is expected, never what was sent."""
        what = f"{rpc} changes what every pipeline answers: only the operator may"
        if not self.admin_token and not self.jwks:
            raise permission_denied(
                f"{what}, and this gateway has no operator credential (set MESHSERVE_GATEWAY_ADMIN_TOKEN or "
                "MESHSERVE_GATEWAY_JWKS, or call the model service directly)"
            )
        credential = bearer_credential(headers)
        if credential is not None and self.admin_token and same_secret(credential, self.admin_token):
            return
        if credential is not None and self.jwks and _looks_like_jwt(credential):
            try:
                claims = tokens.verify(credential, self.jwks)
            except tokens.TokenError as exc:
                raise error_with_code(
                    grpc.StatusCode.UNAUTHENTICATED, f"{rpc}: the bearer JWT is refused: {exc}"
                ) from None
            if claims.subject == tokens.OPERATOR_SUBJECT:
                return
            raise permission_denied(f"{what} (the JWT's subject is not {tokens.OPERATOR_SUBJECT!r})")
        expected = [
            *(["'authorization: Bearer <MESHSERVE_GATEWAY_ADMIN_TOKEN>'"] if self.admin_token else []),
            *([f"'authorization: Bearer <JWT of subject {tokens.OPERATOR_SUBJECT!r}>'"] if self.jwks else []),
        ]
        raise permission_denied(f"{what} (send {' or '.join(expected)})")

    def _operator_metadata(self) -> tuple[tuple[str, str], ...]:
        """The model service's operator credential, for the loads and unloads forwarded to it."""
        token = self.admin_token if self.model_admin_token is None else self.model_admin_token
        return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()

    @staticmethod
    def _timeout(caller_remaining_s: float | None) -> float:
        return FORWARD_TIMEOUT_S if caller_remaining_s is None else caller_remaining_s

    async def _forwarded(self, call: Awaitable[R]) -> R:
        """The call's answer; an unknown model's NotFound names the pipelines too (the caller may mean one)."""
        try:
            return await call
        except NotFound as exc:
            raise NotFound(f"{exc} (pipelines here: {', '.join(sorted(self.pipelines)) or 'none'})") from exc

    async def model_infer(
        self, request: pb.ModelInferRequest, priority: Priority, caller_remaining_s: float | None, headers: Headers
    ) -> pb.ModelInferResponse:
        """Admitted under the model's own pool (a fixed cap: the model service has its own queue); parked while the
        model has no serving replica (the mesh routes the call on its headers alone, as it does the readiness)."""
        self._reachable(request.model_name)
        permit = self.admission.acquire(f"model:{request.model_name}", priority)
        deadline = Deadline(FORWARD_TIMEOUT_S, caller_remaining_s)
        target = Target(request.model_name, request.model_version, routing_headers(headers, PER_REQUEST_HEADERS))

        async def send() -> pb.ModelInferResponse:
            demand = self.demand.enter(request.model_name, "", headers)  # in flight while sent, not while parked
            try:
                call = self.model.model_infer(request, timeout_s=deadline.remaining(), metadata=tuple(headers))
                return await self._forwarded(call)
            finally:
                self.demand.leave(demand)

        try:
            return await self.activator.call(target, send, deadline)
        finally:
            permit.release(sample=False)

    async def model_ready(self, request: pb.ModelReadyRequest, caller_remaining_s: float | None) -> bool:
        """False when the model service says so, or cannot say, or the model is not public."""
        if request.name not in self.public:
            return False
        try:
            response = await self.model.model_ready(request, timeout_s=self._timeout(caller_remaining_s))
        except MeshserveError:
            return False
        return bool(response.ready)

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, caller_remaining_s: float | None
    ) -> pb.ModelMetadataResponse:
        self._reachable(request.name)
        deadline = Deadline(FORWARD_TIMEOUT_S, caller_remaining_s)

        async def send() -> pb.ModelMetadataResponse:  # parked while the model has no serving replica, as an infer
            return await self._forwarded(self.model.model_metadata(request, timeout_s=deadline.remaining()))

        return await self.activator.call(Target(request.name, request.version), send, deadline)

    async def model_config(
        self, request: pb.ModelConfigRequest, caller_remaining_s: float | None
    ) -> pb.ModelConfigResponse:
        self._reachable(request.name)
        deadline = Deadline(FORWARD_TIMEOUT_S, caller_remaining_s)

        async def send() -> pb.ModelConfigResponse:
            return await self._forwarded(self.model.model_config(request, timeout_s=deadline.remaining()))

        return await self.activator.call(Target(request.name, request.version), send, deadline)

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, caller_remaining_s: float | None
    ) -> pb.ModelStatisticsResponse:
        self._reachable(request.name)
        return await self._forwarded(self.model.model_statistics(request, timeout_s=self._timeout(caller_remaining_s)))

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, caller_remaining_s: float | None
    ) -> pb.RepositoryIndexResponse:
        """The pipelines, then the model service's public models (left out when it does not answer)."""
        models = pipeline_index(self.pipelines)
        if not self.public:
            return pb.RepositoryIndexResponse(models=models)
        try:
            upstream = await self.model.repository_index(request, timeout_s=self._timeout(caller_remaining_s))
            models.extend(m for m in upstream.models if m.name in self.public)
        except MeshserveError as exc:
            log.debug("model repository index not available: %s", exc)
        return pb.RepositoryIndexResponse(models=models)

    def _not_a_pipeline(self, name: str) -> None:
        if name in self.pipelines:
            raise InvalidArgument(f"{name!r} is a pipeline (defined in YAML); load or unload its model instead")

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, caller_remaining_s: float | None, headers: Headers = ()
    ) -> pb.RepositoryModelLoadResponse:
        self._not_a_pipeline(request.model_name)
        self._operator("RepositoryModelLoad", headers)
        return await self._forwarded(
            self.model.repository_model_load(
                request, timeout_s=self._timeout(caller_remaining_s), metadata=self._operator_metadata()
            )
        )

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, caller_remaining_s: float | None, headers: Headers = ()
    ) -> pb.RepositoryModelUnloadResponse:
        self._not_a_pipeline(request.model_name)
        self._operator("RepositoryModelUnload", headers)
        return await self._forwarded(
            self.model.repository_model_unload(
                request, timeout_s=self._timeout(caller_remaining_s), metadata=self._operator_metadata()
            )
        )
