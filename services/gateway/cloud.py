"""The edge gateway's client to the cloud tier: v2 ModelInfer at the cloud's ingress (through the edge's egress
listener, or straight) with this edge's bearer token, and the bytes it sends counted per pipeline.

The runner sends what crosses through a micro-batcher of its own (stage `cloud`, spans `cloud` and `cloud.batch`),
so general requests that miss together share one WAN call; each call's timeout is the smaller of the pipeline's
`placement.cloud_timeout_ms` and what is left of the caller's deadline, and the call carries the batch span's trace
context, so one trace spans both tiers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
from prometheus_client import Counter

from services.gateway import metrics
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import Headers, channel_options
from services.model.api import InferResult, ModelClient, RawTensor

# Headers a client may have written that never travel to the cloud: its credential (the cloud gets this edge's),
# and W3C baggage, free-form key=value pairs that could carry an identifier.
_NEVER_SENT = ("authorization", "baggage")


class CloudConfigError(ValueError):
    """A cloud client that cannot be built from the settings (no URL, an unreadable token or CA file)."""


def read_token(path: Path | None) -> str:
    """The bearer token in `path` ('' for none): the file's text, without a leading 'Bearer '."""
    if path is None:
        return ""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise CloudConfigError(
            f"MESHSERVE_GATEWAY_CLOUD_TOKEN_FILE: cannot read {path.name} ({exc.strerror})"
        ) from None
    return text.removeprefix("Bearer ").strip()


class CloudClient:
    """ModelInfer at the cloud tier over one long-lived channel (a ModelClient: the cloud's own status codes come
    back as the project's errors), every call with this edge's bearer token.

    Example (what the gateway does for each pipeline that sends general requests to the cloud)::

        client = CloudClient.connect(settings)            # MESHSERVE_GATEWAY_CLOUD_URL, _TOKEN_FILE, _TLS_CA_FILE
        upstream = client.for_pipeline("fraud", "derived_features")
        result = await upstream.infer("fraud_mlp", "", [features], timeout_s=0.2, metadata=headers)  # bytes counted

    Args:
        channel: the channel to the cloud's ingress (or the egress listener that leads there).
        token: the bearer token sent as `authorization: Bearer <token>` on every call ('' for none).
        address: host:port the channel goes to (for messages).
    """

    def __init__(self, channel: grpc.aio.Channel, token: str = "", address: str = "") -> None:
        self.channel = channel
        self.model = ModelClient(channel)
        self.address = address
        self._auth: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()

    @classmethod
    def connect(cls, settings: GatewaySettings) -> CloudClient:
        """A client on the settings' cloud URL: TLS with the CA file when one is set, the token file's token."""
        if not settings.cloud_url:
            raise CloudConfigError(
                "MESHSERVE_GATEWAY_CLOUD_URL is not set: a pipeline sends general requests to the cloud tier"
            )
        token = read_token(settings.cloud_token_file)
        options = channel_options(settings)
        if settings.cloud_tls_ca_file is None:
            channel = grpc.aio.insecure_channel(settings.cloud_url, options=options)
        else:
            try:
                ca = settings.cloud_tls_ca_file.read_bytes()
            except OSError as exc:
                raise CloudConfigError(f"MESHSERVE_GATEWAY_CLOUD_TLS_CA_FILE: cannot read ({exc.strerror})") from None
            credentials = grpc.ssl_channel_credentials(root_certificates=ca)
            channel = grpc.aio.secure_channel(settings.cloud_url, credentials, options=options)
        return cls(channel, token, settings.cloud_url)

    def for_pipeline(self, pipeline: str, leave_edge: str) -> PipelineCloud:
        """The cloud upstream of one pipeline: its calls counted under its labels."""
        return PipelineCloud(self, metrics.CLOUD_BYTES.labels(pipeline, leave_edge))

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[RawTensor],
        *,
        timeout_s: float | None = None,
        metadata: Headers = (),
    ) -> InferResult:
        """One ModelInfer of `model` (a pipeline, or a model the cloud gateway serves by name) with raw inputs; a
        failed call raises MeshserveError with the cloud's code."""
        headers = (*(h for h in metadata if h[0] not in _NEVER_SENT), *self._auth)
        return await self.model.infer(model, version, inputs, timeout_s=timeout_s, metadata=headers)

    async def close(self) -> None:
        await self.channel.close()


def sent_bytes(inputs: Sequence[RawTensor]) -> int:
    """What one call carries across, in bytes: each tensor's raw contents, name, datatype and shape (the
    request's framing, a few dozen bytes, aside)."""
    return sum(len(t.raw) + len(t.name) + len(t.datatype) + 8 * len(t.shape) for t in inputs)


class PipelineCloud:
    """One pipeline's view of the cloud client, shaped as a model upstream (so the runner's model join batches its
    calls); counts what each call sends."""

    def __init__(self, client: CloudClient, sent: Counter) -> None:
        self.client = client
        self.sent = sent

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[RawTensor],
        *,
        timeout_s: float | None = None,
        metadata: Headers = (),
    ) -> InferResult:
        self.sent.inc(sent_bytes(inputs))  # counted as sent: a call that fails may have crossed all the same
        return await self.client.infer(model, version, inputs, timeout_s=timeout_s, metadata=metadata)

    async def ready(
        self, model: str, version: str = "", *, timeout_s: float | None = None, metadata: Headers = ()
    ) -> bool:
        """The cloud is never parked for (no activator on this hop): always ready to be tried."""
        return True
