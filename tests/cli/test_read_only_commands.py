"""Read-only commands create nothing: a mistyped warehouse or pipeline is one clear error line
(exit 3) naming what was looked for and the pipelines that do have checkpoints there. No Spark."""

from __future__ import annotations

import pytest

from checkpoint_lib import cli
from checkpoint_lib.core.errors import NoCheckpointError
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.layout import checkpoint_root


def _tree(path):
    return sorted(p.relative_to(path) for p in path.rglob("*"))


@pytest.mark.parametrize("argv", [
    ["checkpoints", "list", "{p}"],
    ["checkpoints", "show", "{p}", "3"],
    ["recover", "{p}", "--dry-run"],
    ["state", "handles", "{p}"],
])
def test_a_pipeline_that_never_ran_here_is_a_clear_error_and_nothing_is_created(tmp_path, capsys, argv):
    DeltaCheckpointStore.open(checkpoint_root(tmp_path, "payments"))  # payments ran here, transfers did not
    before = _tree(tmp_path)
    code = cli.main([a.format(p="transfers") for a in argv] + ["--warehouse", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3
    assert err.count("\n") == 1 and "never ran in this warehouse" in err, err
    assert "pipelines with checkpoints here: payments" in err
    assert _tree(tmp_path) == before


def test_a_mistyped_warehouse_is_not_created(tmp_path, capsys):
    missing = tmp_path / "wharehouse"
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", str(missing)]) == 3
    assert "check --warehouse and the pipeline name" in capsys.readouterr().err
    assert not missing.exists()
    with pytest.raises(NoCheckpointError):
        DeltaCheckpointStore.existing(checkpoint_root(missing, "payments"))


def test_an_existing_store_opens_for_reading(tmp_path, capsys):
    DeltaCheckpointStore.open(checkpoint_root(tmp_path, "payments"))
    assert DeltaCheckpointStore.existing(checkpoint_root(tmp_path, "payments")).history() == []
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", str(tmp_path), "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
