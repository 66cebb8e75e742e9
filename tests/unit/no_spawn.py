"""A guard that makes starting a process fail while it is installed, so a unit test stays in this process."""

from __future__ import annotations

import _posixsubprocess
import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

MESSAGE = "unit tests spawn no processes: move this test to tests/integration"
# Modules whose own short-lived helper processes are allowed: ctypes.util.find_library runs `ldconfig -p` (or gcc, ld)
# to find a shared library, which libraries do when imported (trio does, for libpthread), not a test's process.
ALLOWED_CALLERS = frozenset({"ctypes.util"})


def called_from_allowed_module() -> bool:
    """Whether the Popen being started was made by a module in ALLOWED_CALLERS (the stack above the guard)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") in ALLOWED_CALLERS:
            return True
        frame = frame.f_back
    return False


class SpawnInUnitTest(RuntimeError):
    """A unit test (or code it calls) tried to start a process."""


class SpawnGuard:
    """Refuses every way this process could start another one, and keeps what was tried since the last check."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def refuse(self, what: str) -> NoReturn:
        self.attempts.append(what)
        raise SpawnInUnitTest(f"{MESSAGE} (it called {what})")

    def refusing(self, what: str) -> Callable[..., NoReturn]:
        def refused(*args: Any, **kwargs: Any) -> NoReturn:
            self.refuse(what)

        return refused

    @contextmanager
    def installed(self) -> Iterator[SpawnGuard]:
        """Patch the points every process start goes through, and restore them on exit.

        subprocess.Popen's _execute_child is where every Popen (subprocess.run, os.popen, asyncio's subprocess
        transports, a library's own Popen subclass) forks; _posixsubprocess.fork_exec is what multiprocessing's
        spawn and forkserver contexts call; os.fork is the fork context's. asyncio's two entry points are patched
        as well so a coroutine gets the message before an event loop is involved. A Popen made by a module in
        ALLOWED_CALLERS goes through.
        """
        execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
        refused_popen = self.refusing("subprocess.Popen")

        def popen_execute_child(popen: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
            if not called_from_allowed_module():
                refused_popen()
            execute_child(popen, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(subprocess.Popen, "_execute_child", popen_execute_child)
            patch.setattr(_posixsubprocess, "fork_exec", self.refusing("_posixsubprocess.fork_exec"))
            patch.setattr(asyncio, "create_subprocess_exec", self.refusing("asyncio.create_subprocess_exec"))
            patch.setattr(asyncio, "create_subprocess_shell", self.refusing("asyncio.create_subprocess_shell"))
            for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
                if hasattr(os, name):
                    patch.setattr(os, name, self.refusing(f"os.{name}"))
            yield self

    def check(self) -> None:
        """Fail the test that tried to start a process, even when the code it called caught the error."""
        tried, self.attempts = self.attempts, []
        if tried:
            pytest.fail(f"{MESSAGE}: it tried {', '.join(tried)}", pytrace=False)
