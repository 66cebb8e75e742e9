"""Logging set-up shared by every service: one line per record, with the service name."""

from __future__ import annotations

import logging


def setup_logging(service: str, level: str = "INFO") -> None:
    """Configure the root logger once per process."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )
