"""What a fresh clone gets: no machine-local state tracked. A link committed from a work tree that
pointed its ``.cache`` at another checkout's made every fresh clone's ``make setup`` fail
("Too many levels of symbolic links")."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL = (".venv", ".cache", ".airflow", ".chaos", "spark-warehouse", "warehouse")  # made by set-up and runs


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z", "-s"], cwd=REPO, check=True, capture_output=True).stdout.decode()
    return [entry for entry in out.split("\0") if entry]


def test_no_machine_local_folder_is_tracked():
    names = [entry.split("\t", 1)[1] for entry in _tracked()]
    assert [n for n in names if n.split("/", 1)[0] in LOCAL] == []


def test_every_tracked_link_is_relative_and_stays_in_the_checkout():
    for entry in _tracked():
        mode, _, rest = entry.partition(" ")
        if mode != "120000":
            continue
        name = rest.split("\t", 1)[1]
        target = os.readlink(REPO / name) if (REPO / name).is_symlink() else None
        assert target is not None and not os.path.isabs(target), (name, target)
        assert (REPO / name).parent.joinpath(target).resolve().is_relative_to(REPO), (name, target)
