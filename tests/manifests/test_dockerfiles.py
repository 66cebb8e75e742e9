"""Static checks of services/*/Dockerfile and .dockerignore (Docker itself is not needed)."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field

import pytest

from tests.manifests.support import REPO

# Each image installs only its own extra (the gateway and the scaler: the base dependencies).
EXTRAS = {"gateway": set(), "model": {"model"}, "feature": {"feature"}, "cache": {"cache"}, "scaler": set()}


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> list[Stage]:
    """Stages of a Dockerfile: FROM lines start one; continuation lines are joined; comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    stages: list[Stage] = []
    for line in joined.splitlines():
        if not line.strip():
            continue
        op, _, rest = line.strip().partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), flags=re.IGNORECASE)
            assert m, line
            stages.append(Stage(m.group(1), m.group(2)))
        elif stages:
            stages[-1].instructions.append((op, rest.strip()))
    return stages


def extras_installed(stage: Stage) -> set[str]:
    extras: set[str] = set()
    for op, rest in stage.instructions:
        if op != "RUN":
            continue
        for command in re.split(r"&&|;", rest):
            words = shlex.split(command)
            verb = next((w for w in words if w in ("install", "wheel")), None)
            if "pip" not in words or verb is None:
                continue
            for word in words[words.index(verb) + 1 :]:
                if m := re.fullmatch(r"(?:\.|meshserve)\[([a-z,]+)\]", word):
                    extras |= set(m.group(1).split(","))
    return extras


def lineage(stages: list[Stage], stage: Stage) -> list[Stage]:
    """The stage and the stages it is built FROM, within this Dockerfile."""
    by_name = {s.name: s for s in stages if s.name}
    chain = [stage]
    while chain[-1].base in by_name:
        chain.append(by_name[chain[-1].base])
    return chain


@pytest.mark.parametrize("service", sorted(EXTRAS))
def test_dockerfile(service: str) -> None:
    stages = parse((REPO / "services" / service / "Dockerfile").read_text())
    assert len(stages) >= 2, "multi-stage: a builder and a slim runtime"
    runtime = stages[-1]
    assert "slim" in runtime.base or runtime.base.startswith("${"), runtime.base
    users = [rest for op, rest in runtime.instructions if op == "USER"]
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: numeric and non-root (runAsNonRoot checks it)"
    (entry,) = [rest for op, rest in runtime.instructions if op == "ENTRYPOINT"]
    assert entry == f'["python", "-m", "services.{service}"]'
    # The runtime's venv comes from one stage; that stage (and its parents) installs only this extra.
    venv_from = [
        m.group(1)
        for op, rest in runtime.instructions
        if op == "COPY" and "/opt/venv" in rest and (m := re.search(r"--from=(\S+)", rest))
    ]
    assert venv_from, "the runtime copies the venv from the builder"
    (builder,) = [s for s in stages if s.name == venv_from[0]]
    installed = set().union(*(extras_installed(s) for s in lineage(stages, builder)))
    assert installed == EXTRAS[service], f"installs extras {installed}, expected {EXTRAS[service]}"
    assert not any(op == "RUN" and "pip install" in rest for op, rest in runtime.instructions)


def test_extras_exist_in_pyproject() -> None:
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert set().union(*EXTRAS.values()) <= declared


def test_dockerignore() -> None:
    lines = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "models/*/[0-9]*/"} <= lines
    for needed in ("services", "pipelines", "features", "models", "pyproject.toml", "README.md"):
        assert needed not in lines and f"{needed}/" not in lines, f"{needed} is needed by the Dockerfiles"
