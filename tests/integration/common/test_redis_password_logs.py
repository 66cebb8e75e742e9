"""A Redis password never reaches the logs: the feature and cache services, started on a Redis URL with a password
that nothing answers, say where Redis is without the password."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.redis import redact
from tests.helpers.servers import cache_service, feature_service, free_port


def test_redact_hides_only_the_password() -> None:
    assert redact("redis://:s3cret@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert redact("redis://user:s3cret@host/1") == "redis://user:***@host/1"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize("start", [feature_service, cache_service])
def test_a_service_on_an_unanswering_redis_logs_no_password(start: object, tmp_path: Path) -> None:
    url = f"redis://:hunter2-very-secret@127.0.0.1:{free_port()}/0"
    with start(tmp_path, MESHSERVE_REDIS_URL=url) as service:  # type: ignore[operator]
        log = service.log()
    assert "does not answer" in log and ":***@127.0.0.1" in log
    assert "hunter2-very-secret" not in log
