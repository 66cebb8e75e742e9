"""What the retroactive-collection tests share: an exporter that keeps what a collector exports, and the HTTP
status of a request to an admin endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence

from opentelemetry.proto.trace.v1 import trace_pb2


def http_status(url: str, body: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body), timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


class Exported:
    """An OtlpExporter stand-in that keeps what it is given."""

    def __init__(self) -> None:
        self.requests: list[list[trace_pb2.ResourceSpans]] = []
        self.exported_spans = 0
        self.failures = 0

    async def export(self, items: Sequence[trace_pb2.ResourceSpans]) -> bool:
        self.requests.append(list(items))
        return True

    async def close(self) -> None:
        pass
