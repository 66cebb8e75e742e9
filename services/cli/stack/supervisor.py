"""Supervisor of the local stack: start processes in dependency order, wait for health, restart, add and retire
processes while it runs, stop."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from services.cli.stack.specs import ProcessSpec

START_HEADER = "=== meshserve up: starting"
Notify = Callable[[str], None]
HealthProbe = Callable[[ProcessSpec], Awaitable[bool]]


class BackoffPolicy(BaseModel):
    """Restart delays: initial_s, then times factor per consecutive crash, at most max_s.

    A process that ran at least reset_after_s before it crashed starts again from initial_s.
    """

    initial_s: float = Field(0.5, gt=0)
    factor: float = Field(2.0, ge=1)
    max_s: float = Field(30.0, gt=0)
    reset_after_s: float = Field(30.0, ge=0)

    def delay(self, failures: int) -> float:
        """Delay before the restart that follows the `failures`-th consecutive crash (1-based)."""
        return min(self.max_s, self.initial_s * self.factor ** max(0, failures - 1))


class StackError(RuntimeError):
    """The stack could not start (a process never became healthy); the message names it and shows its log."""


async def check_health(spec: ProcessSpec, timeout_s: float = 1.0) -> bool:
    """Ready: its health URL answers 200, its Envoy admin says LIVE, or its port or Unix socket answers (gRPC health
    SERVING, or Redis PONG after AUTH); with none of these: once started."""
    if spec.health_url is not None:
        return await asyncio.to_thread(http_ok, spec.health_url, timeout_s)
    if spec.envoy_admin is not None:
        from services.mesh.admin import EnvoyAdmin

        return await asyncio.to_thread(EnvoyAdmin(spec.envoy_admin, timeout_s).ready)
    if spec.address is None:
        return True
    if spec.protocol == "redis" and spec.port is not None:
        from services.common.embedded import ping

        password = spec.password.get_secret_value() if spec.password is not None else ""
        return await asyncio.to_thread(ping, spec.host, spec.port, password, timeout_s) == "PONG"
    assert spec.address is not None
    return await grpc_health(spec.address, timeout_s)


def http_ok(url: str, timeout_s: float) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


async def grpc_health(address: str, rpc_timeout_s: float = 1.0, root_certificates: bytes | None = None) -> bool:
    """True when `address` answers grpc.health.v1 Check("") with SERVING (over TLS trusting `root_certificates`)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if root_certificates is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        channel = grpc.aio.secure_channel(address, credentials)
    else:
        channel = grpc.aio.insecure_channel(address)
    async with channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=rpc_timeout_s)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def _has_prctl() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "prctl")
    except OSError:
        return False


# Each child dies with the supervisor, even when it is killed (SIGKILL): PR_SET_PDEATHSIG (Linux) set by a tiny
# interpreter that then execs the child's argv, keeping its pid. Not a preexec_fn: that forks and runs Python in the
# child, and with grpc's threads busy in this process (the autoscaler's calls, health checks) 15 of 120 such children
# died of SIGSEGV before their exec, and the parent's grpc poller lost its epoll descriptor. Without a preexec_fn
# Python spawns with vfork, which runs neither Python nor grpc's fork handlers. It exits at once if the supervisor
# died before prctl took effect.
DIE_WITH_PARENT = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); os.execvp(sys.argv[2], sys.argv[2:])"
)
_PDEATHSIG = _has_prctl()


def dying_with_parent(argv: list[str], env: dict[str, str], cwd: Path | None) -> list[str]:
    """`argv` run so that it gets SIGTERM when this process dies (unchanged where Linux's prctl is not there).
    FileNotFoundError or PermissionError here, as a direct spawn raises them, when argv[0] (looked up on env's PATH,
    or relative to `cwd`) is not an executable file."""
    if not _PDEATHSIG:
        return list(argv)
    program = argv[0]
    if os.sep in program:
        path = Path(program) if Path(program).is_absolute() or cwd is None else cwd / program
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    elif shutil.which(program, path=env.get("PATH")) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return [sys.executable, "-S", "-c", DIE_WITH_PARENT, str(os.getpid()), *argv]


def _healthy_word(spec: ProcessSpec) -> str:
    probed_by_port = spec.health_url is None and spec.envoy_admin is None
    return "SERVING" if probed_by_port and spec.protocol == "grpc" else "ready"


def tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log since its last start header."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text[max(0, text.rfind(START_HEADER)) :].splitlines()[-lines:])


@dataclass
class Managed:
    """Run-time state of one supervised process."""

    spec: ProcessSpec
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures: int = 0  # consecutive crashes (reset after a stable run)
    state: str = "new"  # new, running, serving, backoff, stopped, retired
    watcher: asyncio.Task[None] | None = None
    retired: bool = False  # retire() took it out: its exit is not a crash

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class Supervisor:
    """Owns the stack's processes: `start()` in dependency order, restart on crash, `stop()` in reverse order; while
    it runs, `add()` starts one more process (an autoscaled replica) and `retire()` stops one for good."""

    def __init__(
        self,
        specs: list[ProcessSpec],
        log_dir: Path,
        policy: BackoffPolicy | None = None,
        notify: Notify = print,
        health: HealthProbe = check_health,
        stop_timeout_s: float = 10.0,
        cwd: Path | None = None,
        on_spawn: Callable[[Managed], None] | None = None,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate process names: {names}")
        for s in specs:
            missing = set(s.depends_on) - set(names)
            if missing:
                raise ValueError(f"{s.name} depends on unknown {sorted(missing)}")
        self.log_dir = log_dir
        self.policy = policy or BackoffPolicy()
        self.notify = notify
        self.health = health
        self.stop_timeout_s = stop_timeout_s
        self.cwd = cwd
        self.on_spawn = on_spawn  # e.g. rewrite the state file with the new pid
        self.procs = {s.name: Managed(s, log_dir / f"{s.name}.log") for s in specs}
        self.stopping = False
        self._wake = asyncio.Event()  # set by stop(): ends backoff sleeps at once
        self._tasks: set[asyncio.Task[None]] = set()

    def levels(self) -> list[list[str]]:
        """Process names grouped so that each group depends only on earlier groups."""
        done: set[str] = set()
        levels: list[list[str]] = []
        pending = list(self.procs)
        while pending:
            level = [n for n in pending if set(self.procs[n].spec.depends_on) <= done]
            if not level:
                raise ValueError(f"dependency cycle among {pending}")
            levels.append(level)
            done.update(level)
            pending = [n for n in pending if n not in done]
        return levels

    async def start(self, timeout_s: float = 120.0) -> None:
        """Start level by level; each level's processes must be SERVING before the next starts."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for level in self.levels():
            for name in level:
                m = self.procs[name]
                try:
                    await self._spawn(m)
                except OSError as e:
                    raise StackError(f"{name}: cannot start {m.spec.argv[0]}: {e}") from None
                m.watcher = asyncio.create_task(self._watch(m), name=f"watch-{name}")
            await asyncio.gather(*(self.wait_healthy(self.procs[n], timeout_s) for n in level))

    async def wait_healthy(self, m: Managed, timeout_s: float, poll_s: float = 0.2) -> None:
        """Until the process is running and healthy; crashes meanwhile are restarted by its watcher."""
        deadline = time.monotonic() + timeout_s
        while not self.stopping:
            if m.retired:
                raise StackError(f"{m.spec.name} was retired before it became {_healthy_word(m.spec)}")
            if m.running and await self.health(m.spec):
                m.state = "serving"
                where = f" on {m.spec.address}" if m.spec.address else ""
                self.notify(f"{m.spec.name} is {_healthy_word(m.spec)}{where}")
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"{m.spec.name} not SERVING after {timeout_s:.0f}s ({m.restarts} restarts); "
                    f"last lines of {m.log_path}:\n{tail(m.log_path)}"
                )
            await asyncio.sleep(poll_s)

    async def add(self, spec: ProcessSpec) -> Managed:
        """Start a process while the stack runs, watched like the others (restarted after a crash); returns once it
        is spawned (`wait_healthy` says when it serves). Its dependencies must be supervised already; the name of a
        retired process may be used again. StackError when the stack is stopping or the process cannot start."""
        if self.stopping:
            raise StackError(f"{spec.name}: the stack is stopping")
        if spec.name in self.procs:
            raise ValueError(f"{spec.name} is supervised already")
        missing = set(spec.depends_on) - set(self.procs)
        if missing:
            raise ValueError(f"{spec.name} depends on unknown {sorted(missing)}")
        m = Managed(spec, self.log_dir / f"{spec.name}.log")
        self.procs[spec.name] = m
        try:
            await self._spawn(m)
        except OSError as e:
            del self.procs[spec.name]
            raise StackError(f"{spec.name}: cannot start {spec.argv[0]}: {e}") from None
        m.watcher = asyncio.create_task(self._watch(m), name=f"watch-{spec.name}")
        return m

    async def retire(self, name: str) -> None:
        """Stop one process for good: no restart from now on, SIGTERM, wait for it to drain and exit (SIGKILL after
        stop_timeout_s), then forget it. A process that is not supervised (retired already) is left alone."""
        m = self.procs.get(name)
        if m is None:
            return
        m.retired = True
        if m.watcher is not None:  # waiting for an exit or a backoff: neither may restart it now
            m.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await m.watcher
        await self._terminate(m)
        m.state = "retired"
        if self.procs.get(name) is m:
            del self.procs[name]
        self.notify(f"{name} retired")

    async def _spawn(self, m: Managed) -> None:
        env = {**os.environ, **m.spec.env}
        with m.log_path.open("ab") as log:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            log.write(f"{START_HEADER} {m.spec.name} at {stamp}: {' '.join(m.spec.argv)}\n".encode())
            log.flush()
            m.process = await asyncio.create_subprocess_exec(
                *dying_with_parent(m.spec.argv, env, self.cwd),
                env=env,
                cwd=self.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only the supervisor, which stops children in order
            )
        m.started_at = time.monotonic()
        m.state = "running"
        if self.on_spawn is not None:
            self.on_spawn(m)

    async def _watch(self, m: Managed) -> None:
        """Wait for the process to exit; unless stopping, restart it after the backoff delay."""
        while True:
            code: int | str = await m.process.wait() if m.process is not None else "none (it did not start)"
            if self.stopping or m.retired:
                m.state = "stopped"
                return
            uptime = time.monotonic() - m.started_at
            if uptime >= self.policy.reset_after_s:
                m.failures = 0
            m.failures += 1
            delay = self.policy.delay(m.failures)
            m.state = "backoff"
            self.notify(
                f"{m.spec.name} exited with code {code} after {uptime:.1f}s; "
                f"restarting in {delay:.1f}s (restart {m.restarts + 1}, see {m.log_path})"
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            if self.stopping or m.retired:
                m.state = "stopped"
                return
            m.restarts += 1
            try:
                await self._spawn(m)
            except OSError as e:  # e.g. the binary vanished: counts as a crash, retried after the next delay
                self.notify(f"{m.spec.name} could not start: {e}")
                m.process = None
                continue
            if m.spec.address is not None or m.spec.health_url is not None or m.spec.envoy_admin is not None:
                task = asyncio.create_task(self._announce_recovery(m))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _announce_recovery(self, m: Managed) -> None:
        process = m.process
        while not self.stopping and m.process is process and m.running:
            if await self.health(m.spec):
                m.state = "serving"
                self.notify(f"{m.spec.name} is {_healthy_word(m.spec)} again (pid {m.pid})")
                return
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        """SIGTERM in reverse dependency order (each level waits up to stop_timeout_s, then SIGKILL)."""
        self.stopping = True
        self._wake.set()
        for level in reversed(self.levels()):
            await asyncio.gather(*(self._terminate(self.procs[n]) for n in level))
        for m in self.procs.values():
            if m.watcher is not None:
                m.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await m.watcher
            m.state = "stopped"

    async def _terminate(self, m: Managed) -> None:
        if not m.running:
            return
        assert m.process is not None
        with contextlib.suppress(ProcessLookupError):
            m.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(m.process.wait(), self.stop_timeout_s)
        except TimeoutError:
            self.notify(f"{m.spec.name} still running {self.stop_timeout_s:.0f}s after SIGTERM; killing it")
            with contextlib.suppress(ProcessLookupError):
                m.process.kill()
            await m.process.wait()
