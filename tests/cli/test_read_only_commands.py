"""Read-only commands create nothing: a mistyped warehouse or pipeline is one clear error line
(exit 3) naming what was looked for and the pipelines that do have checkpoints there. No Spark."""

from __future__ import annotations

import json

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
    assert DeltaCheckpointStore.existing(checkpoint_root(tmp_path, "payments")).checkpoints.history() == []
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", str(tmp_path), "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"


def test_a_discarded_checkpoint_is_listed_under_the_epoch_that_completed_it(tmp_path, capsys):
    from history import completed

    root = checkpoint_root(tmp_path, "payments")
    first = DeltaCheckpointStore.open(root)
    assert first.epochs.begin() == 1
    for cid in (1, 2):
        first.checkpoints.add(completed(cid, 1000.0 * cid), epoch=1)
    second = DeltaCheckpointStore.open(root)
    assert second.epochs.begin() == 2  # a recovery to checkpoint 1 discards 2
    second.checkpoints.mark_discarded([first.checkpoints.get(2)], "rolled back by a recovery to checkpoint 1", epoch=2)
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", str(tmp_path), "-o", "json"]) == 0
    rows = {r["checkpoint_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows[2]["status"], rows[2]["epoch"], rows[2]["discarded_in_epoch"]) == ("discarded", 1, 2)
    assert (rows[1]["status"], rows[1]["epoch"], rows[1]["discarded_in_epoch"]) == ("completed", 1, None)
    assert rows[2]["acks"]["acks"]["balance[0]"]["state"]["key_groups"] == [0, 42]  # an object, not JSON text
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    columns = table[0].split()
    line = next(line.split() for line in table[2:] if line.split()[0] == "2")
    assert line[columns.index("epoch")] == "1" and line[columns.index("status")] == "discarded"
