"""Generate the map of `services/` in docs/architecture.md: one row per module, its docstring's first paragraph.

Everything from the first `### \\`services/...\\`` heading to the end of the page is generated; the text above it
is written by hand. Packages come in a fixed reading order (common first, then the four services, then the
tools), and any package not named in that order follows alphabetically, so a new package appears without a change
here. `--check` generates in memory and fails (exit 1) when the page differs (stale), as `tools/gen_protos.py
--check` does for the generated protobuf code.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "services"
PAGE = ROOT / "docs" / "architecture.md"
MARKER = "\n### `services/"
ORDER = [
    "services/common",
    "services/common/recording",
    "services/gateway",
    "services/model",
    "services/model/backends",
    "services/feature",
    "services/feature/store",
    "services/cache",
    "services/traces",
    "services/mesh",
    "services/cli",
    "services/cli/stack",
]


def cell(text: str) -> str:
    """A docstring paragraph as one Markdown table cell: one line, pipes escaped, angle brackets outside code."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def rows_by_package(root: Path = SERVICES) -> dict[str, list[tuple[str, str]]]:
    """Each package of `root` (as a repository path) with its modules' paths and first docstring paragraphs."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if "protos" in rel.parts or "__pycache__" in rel.parts or path.name == "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
        groups.setdefault(rel.parent.as_posix(), []).append((rel.as_posix(), cell(doc.split("\n\n")[0])))
    return groups


def render_map(groups: dict[str, list[tuple[str, str]]]) -> str:
    """The generated part of the page: one heading and table per package."""
    order = [g for g in ORDER if g in groups] + sorted(set(groups) - set(ORDER))
    blocks = []
    for group in order:
        rows = "\n".join(f"| `{path}` | {doc} |" for path, doc in groups[group])
        blocks.append(f"### `{group}/`\n\n| module | what it does |\n| --- | --- |\n{rows}")
    return "\n\n".join(blocks) + "\n"


def generate(page: str) -> str:
    """`page` with its map replaced by one generated from the tree."""
    if MARKER not in page:
        raise SystemExit(f"{PAGE.relative_to(ROOT)} has no map heading (### `services/...`) to generate from")
    head = page[: page.index(MARKER)].rstrip("\n")
    return head + "\n\n" + render_map(rows_by_package())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when docs/architecture.md's map is stale")
    args = parser.parse_args()
    current = PAGE.read_text()
    wanted = generate(current)
    if args.check:
        if wanted != current:
            print(
                "docs/architecture.md's map of services/ is stale: run `.venv/bin/python tools/gen_module_map.py`",
                file=sys.stderr,
            )
            raise SystemExit(1)
        return
    if wanted != current:
        PAGE.write_text(wanted)
        print(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
