"""The README, docs/ and NOTES.md link only to files and headings that exist inside the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "NOTES.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_links_resolve_inside_the_repository():
    bad = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            name, _, fragment = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            if ROOT not in path.parents and path != ROOT or not path.exists():
                bad.append(f"{doc.name}: {target} (no such file in the repository)")
            elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
                bad.append(f"{doc.name}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_every_docs_page_is_one_link_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {t.partition("#")[0] for t in LINK.findall(readme)}
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= linked
    assert {"NOTES.md", "BENCHMARKS.md"} <= linked


def test_code_cites_notes_sections_that_exist():
    anchors = _anchors(ROOT / "NOTES.md")
    code = [p for d in ("eagle2_local", "convert", "benchmarks", "tests") for p in (ROOT / d).rglob("*")
            if p.suffix in (".py", ".sh")]
    cited = {(p.relative_to(ROOT), a) for p in code for a in re.findall(r"NOTES\.md#([\w\-]+)", p.read_text())}
    assert cited and not [f"{p}: NOTES.md#{a}" for p, a in cited if a not in anchors]
