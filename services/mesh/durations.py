"""Istio (Go) duration strings such as `1m30s` or `250ms` to seconds and to Envoy's `1.250s` form."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string (`5s`, `100ms`, `1h30m`); ValueError when it is not one."""
    text = text.strip()
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ValueError(f"not a duration: {text!r} (expected e.g. '5s', '250ms', '1m30s')")
    return total


def envoy_duration(seconds: float) -> str:
    """Protobuf JSON duration (`0.250s`), the form Envoy's YAML expects."""
    text = f"{seconds:.9f}".rstrip("0").rstrip(".")
    return f"{text}s"


def _check(text: str) -> str:
    parse_duration(text)
    return text


Duration = Annotated[str, AfterValidator(_check)]
"""A field holding a Go duration string, validated on load and kept as written."""
