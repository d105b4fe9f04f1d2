"""Every relative link and anchor in README.md and docs/*.md resolves."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', path.read_text()))
    return out


def _broken(path: Path) -> list[str]:
    bad = []
    for m in LINK.finditer(FENCE.sub("", path.read_text())):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.name}: {target} (no file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{path.name}: {target} (no anchor)")
    return bad


def test_slug_follows_github() -> None:
    assert _slug("Capacity planning") == "capacity-planning"
    assert _slug("`run` and `--n-trials`: resume") == "run-and---n-trials-resume"


def test_every_relative_link_and_anchor_resolves() -> None:
    bad = [b for p in DOCS for b in _broken(p)]
    assert not bad, "\n".join(bad)
