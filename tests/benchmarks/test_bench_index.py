"""docs/bench/README.md lists every benchmark run (a run committed without regenerating it fails here), and every
file under docs/ is reachable by links from the README (issue 37)."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import bench_index

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_index_is_current():
    assert bench_index.INDEX.read_text() == bench_index.render(), "run: python -m benchmarks.bench_index"


def _links(md: Path) -> list[Path]:
    out = []
    for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
        target = m.group(1)
        if not target.startswith(("http://", "https://", "mailto:")):
            out.append((md.parent / target).resolve())
    return out


def test_every_doc_is_reachable_from_the_readme_and_every_link_resolves():
    seen: set[Path] = set()
    todo = [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for target in _links(page):
            assert target.exists(), f"{page.relative_to(ROOT)} links to a missing {target}"
            if target.suffix == ".md" and target not in seen:
                todo.append(target)
            seen.add(target) if target.suffix != ".md" else None
    docs = {p.resolve() for p in (ROOT / "docs").rglob("*") if p.is_file()}
    assert sorted(str(p.relative_to(ROOT)) for p in docs - seen) == []
