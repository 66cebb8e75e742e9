"""`meshserve token`: a caller's JWT (a client's, or the operator's) signed with the local stack's key, valid for a
`--ttl` such as 30d."""

from __future__ import annotations

import re
from pathlib import Path

from services.cli.stack.credentials import StackSecrets
from services.cli.stack.state import entry_dir
from services.common.tokens import OPERATOR_SUBJECT

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_TTL_S = 366 * 86400


class TtlError(ValueError):
    """A --ttl that is not a positive duration of at most a year."""


def parse_ttl(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' or plain seconds, to seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if match is None:
        raise TtlError(f"--ttl {text!r}: expected a number with an optional unit s, m, h, d or w (e.g. 30d)")
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    if not 0 < seconds <= MAX_TTL_S:
        raise TtlError(f"--ttl {text!r}: must be more than 0 and at most 366d")
    return seconds


def issue(log_dir: Path, client: str | None, operator: bool = False, ttl: str = "30d") -> str:
    """The token for `client` (or the operator) from the stack's signing key in `log_dir` (the edge's, when two
    tiers run there).

    Raises TtlError, services.common.tokens.TokenError (a bad client name) or SecretsError (no stack secrets).
    """
    if operator and client not in (None, OPERATOR_SUBJECT):
        raise ValueError(f"--operator mints the operator's token (subject {OPERATOR_SUBJECT!r}); drop the client name")
    if not operator and not client:
        raise ValueError("name the client (its token's subject), or pass --operator")
    if not operator and client == OPERATOR_SUBJECT:
        raise ValueError(f"{OPERATOR_SUBJECT!r} is the operator's subject: pass --operator to mean it")
    subject = OPERATOR_SUBJECT if operator else client
    assert subject is not None
    return StackSecrets.of(entry_dir(log_dir)).mint(subject, parse_ttl(ttl))
