"""What one answer of the chaos run was: whole, degraded (by cause), refused (by code, with a retry pushback), failed
(by code) or lost (no answer by its deadline)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

WHOLE, DEGRADED, REFUSED, FAILED, LOST = "whole", "degraded", "refused", "failed", "lost"
KINDS = (WHOLE, DEGRADED, REFUSED, FAILED, LOST)
OK_KINDS = (WHOLE, DEGRADED)  # an answer with outputs
PUSHBACK = "grpc-retry-pushback-ms"
# Codes a service refuses with when it tells the caller to come back (admission control, a draining replica).
REFUSAL_CODES = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE"})
# How the answers Envoy's ingress makes itself begin (its local replies: istio/envoyfilters.yaml).
INGRESS_MESSAGE = "meshserve ingress:"
# A DEADLINE_EXCEEDED this close to the caller's own deadline is the deadline passing with no answer (gRPC's client
# raises it at the deadline; a server honouring the propagated deadline answers it a hair earlier).
LOST_AT = 0.95


@dataclass(frozen=True, slots=True)
class Outcome:
    """The kind of an answer and its reason: the `degraded` parameter, or the status code's name."""

    kind: str
    reason: str = ""


def answered(degraded: str) -> Outcome:
    """An OK answer: whole, or degraded by the cause its `degraded` response parameter names."""
    return Outcome(DEGRADED, degraded) if degraded else Outcome(WHOLE)


def errored(code: str, pushback: bool, elapsed_s: float, deadline_s: float, details: str = "") -> Outcome:
    """A non-OK status: lost when it is the deadline passing, refused when it is a refusal code with a retry
    pushback, failed otherwise (a refusal code without a pushback is a failure: the caller was not told to wait).
    A refusal or failure Envoy's ingress answered itself (its message says so) has the reason `<code>:ingress`, so
    that the ingress's refusals are told from the gateways'."""
    if code == "DEADLINE_EXCEEDED" and elapsed_s >= LOST_AT * deadline_s:
        return Outcome(LOST, code)
    reason = f"{code}:ingress" if details.startswith(INGRESS_MESSAGE) else code
    if code in REFUSAL_CODES and pushback:
        return Outcome(REFUSED, reason)
    return Outcome(FAILED, reason)


def has_pushback(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """Whether the trailers carry a retry pushback (gRPC's `grpc-retry-pushback-ms`)."""
    return any(key == PUSHBACK for key, _ in trailing_metadata or ())
