"""The column names the library keeps for itself (issue 46): one definition
(:mod:`checkpoint_lib.reserved`), refused wherever a pipeline declares columns, with one message
naming the column, what it is for and what to do. Everything else is the records' own: the
runtime's tests (``tests/spark/test_reserved_names.py``) run records named like every other column
of ours."""

from __future__ import annotations

import pytest

from checkpoint_lib.pipeline import Bootstrap, DeltaSink, DeltaSource, Pipeline
from checkpoint_lib.reserved import (
    PREFIX,
    RECORD_COLUMNS,
    SINK_COLUMNS,
    STATE_COLUMNS,
    ReservedColumnError,
    check_columns,
    temporary,
)


class Op:
    state_schema = "total long"
    order_by = ("src_version",)

    def apply(self, records, state, key):  # pragma: no cover - never run here
        return state, {}


def source(**extra: str) -> DeltaSource:
    return DeltaSource("landing/x", {"id": "string", "account": "string", **extra})


@pytest.mark.parametrize("name", [*RECORD_COLUMNS, temporary("error"), f"{PREFIX}anything"])
def test_a_reserved_name_in_a_source_or_a_map_is_refused_naming_it_and_its_use(name):
    use = RECORD_COLUMNS.get(name, "temporary columns")
    with pytest.raises(ReservedColumnError, match=rf"source landing/x: column '{name}' is reserved: checkpoint_lib "
                                                  rf"uses it for .*{use[:20]}.*Leave it out of the source's schema"):
        Pipeline("p").source(source(**{name: "long"}))
    with pytest.raises(ReservedColumnError, match=rf"map\(\) output: column '{name}' is reserved"):
        Pipeline("p").source(source()).map(lambda df: df, schema={"id": "string", "account": "string", name: "long"})
    with pytest.raises(ReservedColumnError, match=rf"bootstrap table b: column '{name}' is reserved"):
        Pipeline("p").source(source()).bootstrap(Bootstrap("b", {"account": "string", name: "long"}, lambda df: df))


@pytest.mark.parametrize("name", list(SINK_COLUMNS))
def test_a_reserved_name_in_a_sink_is_refused(name):
    p = Pipeline("p").source(source()).key_by("account").process(Op(), uid="op")
    with pytest.raises(ReservedColumnError, match=rf"sink 'out' \(gold/out\): column '{name}' is reserved: "
                                                  rf"checkpoint_lib uses it for {SINK_COLUMNS[name][:15]}"):
        p.sink("out", DeltaSink("gold/out", f"account string, {name} long"))


def test_a_reserved_key_or_state_column_is_refused():
    with pytest.raises(ReservedColumnError, match="key_by\\(\\): column 'key_group' is reserved"):
        Pipeline("p").source(source()).key_by("key_group")

    class KeyGroupState(Op):
        state_schema = "key_group int"

    with pytest.raises(ReservedColumnError, match=rf"state_schema: column 'key_group' is reserved: .*{STATE_COLUMNS['key_group']}"):
        Pipeline("p").source(source()).key_by("account").process(KeyGroupState(), uid="op")


def test_a_pipeline_built_without_the_fluent_methods_is_checked_by_validate():
    p = (Pipeline("p").source(source()).key_by("account").process(Op(), uid="op")
         .sink("out", DeltaSink("gold/out", "account string")).dead_letters("dlq/p"))
    p.validate()
    p.source_spec = source(sender="int")
    with pytest.raises(ReservedColumnError, match="records: column 'sender' is reserved"):
        p.validate()


def test_the_names_of_our_own_columns_elsewhere_are_the_records_to_use():
    names = ["kind", "seq", "checkpoint_id", "barrier_ts", "epoch", "error", "record", "_error", "_rank",
             "_file_path", "_ttl_first", "txn_handle", "txn_seq", "flush"]
    check_columns(names, "records")  # nothing raised
    p = (Pipeline("p").source(source(**dict.fromkeys(names, "string"))).key_by("account").process(Op(), uid="op")
         .sink("out", DeltaSink("gold/out", "account string, kind string, error string, _rank long"))
         .dead_letters("dlq/p"))
    assert p.validate() is p
    assert issubclass(ReservedColumnError, ValueError)
