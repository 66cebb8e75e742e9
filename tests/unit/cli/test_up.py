"""What `meshserve up` prints once the stack is up, and where the stack's files are found from any folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rich.console import Console

from services.cli.connect import Endpoint
from services.cli.stack import state
from services.cli.stack.credentials import StackSecrets
from services.cli.stack.layout import StackLayout
from services.cli.stack.state import default_log_dir, stack_address
from services.cli.stack.up import StackRun, announce

ROOT = Path(__file__).resolve().parents[3]


def printed(tmp_path: Path, example: bool, mesh: bool = True) -> str:
    logs = tmp_path / "logs"
    layout = StackLayout.local(8000, models_dir=tmp_path, mesh=mesh, traces=True, log_dir=logs)
    console = Console(record=True, width=200)
    run = StackRun(layout, logs, console, StackSecrets.ensure(logs), asyncio.Event())
    endpoint = Endpoint("127.0.0.1:8080", b"ca") if mesh else Endpoint("127.0.0.1:8000")
    announce(run, endpoint, example=example)
    return console.export_text()


def test_up_prints_how_to_call_the_stack_once_it_is_up(tmp_path: Path) -> None:
    text = printed(tmp_path, example=True)
    assert "stack is up: ingress at 127.0.0.1:8080" in text
    assert "trace UI at http://127.0.0.1:8091/" in text
    assert f"the stack's CA is {tmp_path / 'logs' / 'secrets' / 'ca.pem'}" in text
    assert f"meshserve token my-client --log-dir {tmp_path / 'logs'}" in text
    assert 'triton.InferenceServerClient("127.0.0.1:8080", ssl=True' in text
    plain = printed(tmp_path, example=True, mesh=False)
    assert "stack is up: gateway at 127.0.0.1:8000" in plain and "plaintext, no token" in plain


def test_with_a_demo_the_example_waits_for_the_demo(tmp_path: Path) -> None:
    text = printed(tmp_path, example=False)
    assert "stack is up" in text and "InferenceServerClient" not in text


def test_the_default_log_dir_is_the_same_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = default_log_dir()
    assert here.is_absolute() and here == ROOT / ".logs"
    monkeypatch.chdir(tmp_path)
    assert default_log_dir() == here
    from services.cli.main import DEFAULT_LOG_DIR
    from services.traces.cli import DEFAULT_DB

    assert DEFAULT_LOG_DIR == here and DEFAULT_DB == here / "traces.sqlite"


def test_an_installed_package_keeps_its_stack_in_the_users_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "CHECKOUT", tmp_path / "site-packages")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_log_dir() == tmp_path / "state" / "meshserve"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_log_dir() == Path.home() / ".local" / "state" / "meshserve"


def test_clients_call_the_entry_the_stack_json_names(tmp_path: Path) -> None:
    assert stack_address(tmp_path, "127.0.0.1:8080") == "127.0.0.1:8080"  # no stack there
    (tmp_path / state.STATE_FILE).write_text('{"ingress": "127.0.0.1:18080", "gateway": "127.0.0.1:18000"}')
    assert stack_address(tmp_path, "127.0.0.1:8080") == "127.0.0.1:18080"
    (tmp_path / state.STATE_FILE).write_text('{"ingress": null, "gateway": "127.0.0.1:18000"}')
    assert stack_address(tmp_path, "127.0.0.1:8080") == "127.0.0.1:18000"


def test_ca_prints_the_absolute_path_of_the_stacks_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from services.cli.main import app

    monkeypatch.chdir(tmp_path)
    missing = CliRunner().invoke(app, ["ca", "--log-dir", "logs"])
    assert missing.exit_code == 1 and "meshserve up" in missing.output
    StackSecrets.ensure(tmp_path / "logs")
    found = CliRunner().invoke(app, ["ca", "--log-dir", "logs"])
    assert found.exit_code == 0 and found.stdout.strip() == str(tmp_path.resolve() / "logs" / "secrets" / "ca.pem")
