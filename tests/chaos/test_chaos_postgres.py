"""The chaos harness's ``payments_pg`` scenarios (tests/chaos/chaos_harness.py), without Spark: what a
seed draws, how the report counts them, and the database check - against a real PostgreSQL server
(the chaos tests' own, tests/chaos/conftest.py), given tables right and then wrong in each way it
must catch."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from chaos_harness import (CHAINED_KILLS, EXTERNAL, MODES, PG_KILLS, PG_PIPELINE, PG_SEEDS, PG_SINK_KILLS,
                           PG_SINK_RECOVERY_KILLS, RECOVERY_KILLS, Outcome, fresh_database, pg_tables,
                           postgres_problems, render, scenario, tally)


def test_postgres_scenarios_are_deterministic_and_kill_inside_the_sinks_commit_and_rollback():
    drawn = [scenario(seed) for seed in range(PG_SEEDS, PG_SEEDS + 60)]
    assert drawn == [scenario(seed) for seed in range(PG_SEEDS, PG_SEEDS + 60)]
    assert {s.pipeline for s in drawn} == {PG_PIPELINE}
    assert {s.mode for s in drawn} == set(MODES[PG_PIPELINE]) and "at_least_once" not in MODES[PG_PIPELINE]
    assert all(s.lagging == (s.mode != "aligned") for s in drawn)
    assert {len(s.then) for s in drawn} == {1, 2, 3}  # every run has its recovery killed
    firsts = {s.first.phase for s in drawn}
    assert set(PG_KILLS) | set(PG_SINK_KILLS) | {EXTERNAL} == firsts  # each runner phase in turn, and the sink's
    assert "prepared_rollback" not in firsts  # (a first run has nothing to roll back)
    for s in drawn:
        limits = {**PG_KILLS, **PG_SINK_KILLS, **(CHAINED_KILLS if s.chained else {})}
        assert s.first.phase == EXTERNAL or 1 <= s.first.n <= limits[s.first.phase]
        assert s.first.phase != "channel_state" or s.mode != "aligned"
        for k in s.then:
            assert k.phase == EXTERNAL or 1 <= k.n <= {**RECOVERY_KILLS, **PG_SINK_RECOVERY_KILLS}[k.phase]
    during = Counter(k.phase for s in drawn for k in s.then)
    assert during["prepared_commit"] and during["prepared_rollback"] and during[EXTERNAL]
    assert not any(k.phase == "prepare" for s in drawn for k in s.chain)  # (it fails a Spark task, not the process)
    # the campaign of docs/reliability.md (15 seeds) plans 40 kills and more
    assert sum(len(s.chain) for s in drawn[:15]) >= 40


def test_the_report_counts_the_postgresql_runs_and_their_kills_inside_the_sink():
    outcomes = [
        Outcome(PG_SEEDS, PG_PIPELINE, "aligned", ["prepared_commit:3", "prepared_rollback:1"],
                kills=["prepared_commit", "prepared_rollback"], nth=[0, 1], survived=True),
        Outcome(PG_SEEDS + 1, PG_PIPELINE, "unaligned", ["flush_stage:1", "external@20s"],
                kills=["flush_stage", "prepare"], nth=[0, 1], mismatch="PostgreSQL: 1 rows of ledger repeat an event"),
        Outcome(3, "payments", "aligned", ["commit:1"], kills=["commit"], nth=[0], survived=True),
    ]
    t = tally(outcomes)
    assert (t.runs, t.kills, t.mismatches) == (3, 5, 1)
    assert t.by_phase["prepared_rollback"]["recovery"] == 1 and t.by_phase["prepare"]["external"] == 1
    assert t.by_config[f"{PG_PIPELINE} / aligned"]["kills"] == 2
    text = render(outcomes)
    assert ("2 runs, 4 kills (3 of them inside the sink's write or commit: `prepare`, `prepared_commit`, "
            "`prepared_rollback`), 1 mismatches.") in text
    assert f"| {PG_PIPELINE} / unaligned | 1 | 2 | 0 | 1 | 0 |" in text
    assert "PostgreSQL sink" not in render(outcomes[2:])


def _expected() -> tuple[pd.DataFrame, pd.DataFrame]:
    ledger = pd.DataFrame({"event_id": ["e1", "e2", "e3"], "account": ["a", "b", "a"],
                           "amount_cents": [100, -20, 5], "balance_after_cents": [100, -20, 105]})
    balances = pd.DataFrame({"account": ["a", "b"], "balance_cents": [105, -20], "event_count": [2, 1]})
    return ledger, balances


def _write(server, ledger: pd.DataFrame, balances: pd.DataFrame) -> None:
    """The tables as the pipeline's sinks would hold them (names from its declaration)."""
    tables = pg_tables()
    server.psql(f"CREATE TABLE {tables['balances']} (account text PRIMARY KEY, balance_cents bigint, "
                f"event_count bigint); CREATE TABLE {tables['ledger']} (event_id text, account text, amount_cents bigint, "
                "balance_after_cents bigint)")
    for table, frame in ((tables["balances"], balances), (tables["ledger"], ledger)):
        values = ", ".join("(" + ", ".join(f"'{v}'" if isinstance(v, str) else str(v) for v in row) + ")"
                           for row in frame.itertuples(index=False))
        server.psql(f"INSERT INTO {table} VALUES {values}")


def test_the_database_check_finds_every_kind_of_wrong_table_and_a_transaction_left_prepared(chaos_postgres):
    server = chaos_postgres
    ledger, balances = _expected()
    fresh_database(server)
    _write(server, ledger, balances)
    assert postgres_problems(server, ledger, balances, ledger, exact_order=True) == []

    server.psql("UPDATE balances SET balance_cents = 106 WHERE account = 'a'")
    assert postgres_problems(server, ledger, balances, ledger, exact_order=True) == [
        "1 accounts of balances have a wrong balance or count, e.g. 'a'"]

    fresh_database(server)
    _write(server, pd.concat([ledger, ledger.iloc[[1]]]), balances)  # an append committed twice
    assert postgres_problems(server, ledger, balances, ledger, exact_order=True) == [
        "1 rows of ledger repeat an event, e.g. 'e2'"]

    fresh_database(server)
    _write(server, ledger.iloc[:2], balances.iloc[:1])  # a checkpoint's rows lost, an account missing
    assert postgres_problems(server, ledger, balances, ledger, exact_order=True) == [
        "balances has 1 rows for 1 accounts, expected 2 accounts", "1 valid events missing from ledger, e.g. ['e3']"]

    fresh_database(server)
    other = ledger.assign(balance_after_cents=[100, -20, 6])  # another order than the warehouse's ledger
    _write(server, other, balances)
    assert postgres_problems(server, ledger, balances, ledger, exact_order=False) == [
        "1 rows of ledger have another running balance than the warehouse's ledger"]
    assert postgres_problems(server, ledger, balances, other, exact_order=False) == []
    assert len(postgres_problems(server, ledger, balances, other, exact_order=True)) == 1

    server.psql("BEGIN; INSERT INTO ledger VALUES ('e9', 'a', 1, 1); PREPARE TRANSACTION 'ckpt:left-over'")
    assert postgres_problems(server, ledger, balances, other, exact_order=False) == [
        "1 transactions still prepared after the undisturbed run, e.g. ckpt:left-over"]

    fresh_database(server)  # the next scenario's: nothing prepared, no table
    assert server.psql("SELECT count(*) FROM pg_prepared_xacts", database="postgres") == "0"
    assert postgres_problems(server, ledger, balances, ledger, exact_order=True)[0].startswith(
        "cannot read the database: relation \"balances\" does not exist")
