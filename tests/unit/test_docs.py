"""The documentation keeps up with the code: every module of services/ is on the map in docs/architecture.md, the
map names no module that is gone, and the README stays a short manual that opens with the two commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SERVICES = ROOT / "services"


def service_modules() -> list[str]:
    """Every module of services/ as a repository path, without `__init__.py` and the generated protos."""
    return sorted(
        p.relative_to(ROOT).as_posix()
        for p in SERVICES.rglob("*.py")
        if p.name != "__init__.py" and "protos" not in p.relative_to(SERVICES).parts
    )


def test_every_service_module_is_on_the_architecture_map() -> None:
    text = ARCHITECTURE.read_text()
    missing = [m for m in service_modules() if f"`{m}`" not in text]
    assert not missing, (
        f"{len(missing)} module(s) of services/ missing from the map in docs/architecture.md; add a row for each "
        "(`| `<path>` | <its docstring's first paragraph> |`) under its package:\n" + "\n".join(missing)
    )


def test_the_architecture_map_names_no_module_that_is_gone() -> None:
    named = set(re.findall(r"`(services/[\w/]+\.py)`", ARCHITECTURE.read_text()))
    gone = sorted(m for m in named if not (ROOT / m).is_file())
    assert not gone, "docs/architecture.md names modules that no longer exist (moved or removed):\n" + "\n".join(gone)


def test_the_readme_is_short_and_opens_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    head = "\n".join(lines[:40])
    assert "make run" in head and "make test" in head


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to dashes, repeats
    numbered."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        title = line.lstrip("#").strip().lower()
        slug = "".join(ch for ch in title if ch.isalnum() or ch in "-_ ").replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_between_the_pages_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)\s:#]*)(?:#([^)\s]*))?\)", page.read_text()):
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} does not exist")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target or page.name}#{anchor}: no such heading")
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)
