"""Logging set-up: one line per record with the service name, the level from settings (INFO when unknown)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from services.common.logs import setup_logging


@contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger without handlers, as in a fresh process (pytest's capture handlers set aside meanwhile)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    try:
        yield root
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = handlers, level


def test_one_line_per_record_with_the_service() -> None:
    with bare_root() as root:
        setup_logging("model", "debug")
        assert root.level == logging.DEBUG
        (handler,) = root.handlers
    record = logging.LogRecord("services.model.loader", logging.WARNING, __file__, 1, "loaded %s", ("m",), None)
    line = handler.format(record)
    assert line.endswith(" WARNING model services.model.loader: loaded m") and "\n" not in line


def test_an_unknown_level_is_info() -> None:
    with bare_root() as root:
        setup_logging("cache", "chatty")
        assert root.level == logging.INFO
