"""`meshserve token`: a client's or the operator's JWT from the stack's signing key, for a --ttl."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.main import app
from services.cli.stack.credentials import StackSecrets
from services.cli.tokens import TtlError, parse_ttl
from services.common import tokens


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45), ("2w", 14 * 86400), ("600", 600), ("1.5h", 5400)],
)
def test_ttls_read_with_their_unit(text: str, seconds: float) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-1d", "3y", "400d", "1 day", "d"])
def test_a_bad_ttl_is_refused(text: str) -> None:
    with pytest.raises(TtlError):
        parse_ttl(text)


def test_token_prints_a_jwt_for_the_client_or_the_operator(tmp_path: Path) -> None:
    s = StackSecrets.ensure(tmp_path)
    runner = CliRunner()
    out = runner.invoke(app, ["token", "alice", "--ttl", "2h", "--log-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    claims = tokens.verify(out.stdout.strip(), s.jwks())
    assert claims.subject == "alice" and abs(claims.expires_at - time.time() - 7200) < 60
    op = runner.invoke(app, ["token", "--operator", "--log-dir", str(tmp_path)])
    assert op.exit_code == 0, op.output
    claims = tokens.verify(op.stdout.strip(), s.jwks())
    assert claims.principal == "https://meshserve.local/operator"
    assert abs(claims.expires_at - time.time() - 30 * 86400) < 60


def test_token_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    none = runner.invoke(app, ["token", "alice", "--log-dir", str(tmp_path / "nothing")])
    assert none.exit_code == 1 and "meshserve up" in none.output
    StackSecrets.ensure(tmp_path)
    for args, fragment in [
        (["token"], "name the client"),
        (["token", "operator"], "--operator"),
        (["token", "bob", "--operator"], "drop the client name"),
        (["token", "a/b"], "without '/'"),
        (["token", "bob", "--ttl", "forever"], "--ttl"),
    ]:
        out = runner.invoke(app, [*args, "--log-dir", str(tmp_path)])
        assert out.exit_code == 2 and fragment in out.output, (args, out.output)
