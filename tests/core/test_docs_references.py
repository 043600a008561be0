"""docs/architecture.md is where a newcomer learns where everything lives: each ``file.py::name``
it cites must still name a definition there (two had moved with their code unnoticed)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("checkpoint_lib", "plugins", "dags", "jobs", "bench", "tests")


def _python_files() -> list[Path]:
    return [p for top in SOURCES for p in (REPO / top).rglob("*.py") if ".venv" not in p.parts]


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


def test_every_definition_the_architecture_page_cites_is_where_it_says():
    assert broken_references((REPO / "docs" / "architecture.md").read_text(), _python_files()) == []


def test_a_reference_to_a_moved_definition_is_found():
    files = _python_files()
    assert broken_references("`state.py::TtlMarks` and `delta/ttl_marks.py::TtlMarks`", files) == ["state.py::TtlMarks"]
