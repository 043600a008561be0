"""What Delta's log retention does to a table, for tests: a log checkpoint at the latest version,
then every commit up to a version deleted (moved aside, so a test can put them back)."""

from __future__ import annotations

from pathlib import Path


def expire_log_through(table: str | Path, version: int) -> Path:
    """Checkpoint ``table``'s log at its latest version, then move commits ``0..version`` into
    ``<table>_expired``; returns that folder (:func:`unexpire` puts them back)."""
    from deltalake import DeltaTable

    DeltaTable(str(table)).create_checkpoint()
    aside = Path(f"{table}_expired")
    aside.mkdir()
    for v in range(version + 1):
        (Path(table) / "_delta_log" / f"{v:020d}.json").rename(aside / f"{v:020d}.json")
    return aside


def unexpire(table: str | Path, aside: Path) -> None:
    for commit in aside.iterdir():
        commit.rename(Path(table) / "_delta_log" / commit.name)
    aside.rmdir()
