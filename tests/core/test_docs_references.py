"""The docs cite code as ``file.py::name`` (where a newcomer finds a definition, the test that
proves a row of docs/reliability.md): each must still name a definition in that file (two in
docs/architecture.md and three tests in docs/reliability.md had moved or gone unnoticed)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("checkpoint_lib", "plugins", "dags", "jobs", "bench", "tests")


def _python_files() -> list[Path]:
    return [p for top in SOURCES for p in (REPO / top).rglob("*.py")]


def broken_references(text: str, files: list[Path]) -> list[str]:
    """The ``path.py::name`` references of ``text`` that no file ending in that path defines
    (``name``'s first part as a def, a class or a top-level assignment)."""
    out = []
    for path, name in sorted(set(re.findall(r"`([\w/]+\.py)::([\w.]+)", text))):
        top = re.escape(name.split(".")[0])
        defined = re.compile(rf"^\s*(?:async\s+def|def|class)\s+{top}\b|^{top}\s*(?::|=)", re.M)
        if not any((p.as_posix().endswith("/" + path)) and defined.search(p.read_text(errors="replace"))
                   for p in files):
            out.append(f"{path}::{name}")
    return out


def test_every_definition_the_docs_cite_is_where_they_say():
    files = _python_files()
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert {p.name: b for p in pages if (b := broken_references(p.read_text(), files))} == {}


def test_a_reference_to_a_moved_definition_is_found():
    files = _python_files()
    assert broken_references("`state.py::TtlMarks` and `delta/ttl_marks.py::TtlMarks`", files) == ["state.py::TtlMarks"]
