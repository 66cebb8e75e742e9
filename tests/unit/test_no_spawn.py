"""The unit tests' guard (tests/unit/conftest.py): every way of starting a process fails and says where the test
belongs, and a test whose code caught that error fails all the same."""

from __future__ import annotations

import asyncio
import ctypes.util
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.unit.no_spawn import MESSAGE, SpawnGuard, SpawnInUnitTest


def fork() -> None:
    pid = os.fork()
    if pid == 0:  # only reached if the guard let the fork through
        os._exit(0)
    os.waitpid(pid, 0)


async def loop_subprocess() -> None:
    loop = asyncio.get_running_loop()
    await loop.subprocess_exec(asyncio.SubprocessProtocol, sys.executable, "-c", "pass")


STARTS: dict[str, Callable[[], object]] = {
    "subprocess.run": lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    "os.popen": lambda: os.popen("true").read(),
    "os.system": lambda: os.system("true"),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
    "os.fork": fork,
    "asyncio.create_subprocess_exec": lambda: asyncio.run(asyncio.create_subprocess_exec("true")),
    "loop.subprocess_exec": lambda: asyncio.run(loop_subprocess()),
    "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "multiprocessing fork": lambda: multiprocessing.get_context("fork").Process(target=print).start(),
}


@pytest.mark.parametrize("start", STARTS.values(), ids=STARTS.keys())
def test_starting_a_process_fails_and_says_where_the_test_belongs(
    start: Callable[[], object], spawn_guard: SpawnGuard
) -> None:
    with pytest.raises(SpawnInUnitTest, match="unit tests spawn no processes: move this test to tests/integration"):
        start()
    with pytest.raises(pytest.fail.Exception, match=MESSAGE):
        spawn_guard.check()


def test_a_test_whose_code_swallowed_the_error_still_fails(spawn_guard: SpawnGuard) -> None:
    try:
        subprocess.run(["true"], check=False)
    except Exception:
        pass
    with pytest.raises(pytest.fail.Exception, match=r"it tried subprocess\.Popen"):
        spawn_guard.check()
    spawn_guard.check()  # the check forgets what it reported: the next test starts clean


def test_a_library_lookup_may_run_its_helper(spawn_guard: SpawnGuard) -> None:
    """ctypes.util.find_library runs `ldconfig -p`: what a library does on import, not a test's process."""
    assert ctypes.util.find_library("c") is not None
    assert spawn_guard.attempts == []
