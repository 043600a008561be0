"""The chaos report's arithmetic (no Spark): which kill of a chain each interrupted phase counts as."""

from __future__ import annotations

from chaos_harness import Kill, Outcome, load, record, render, scenario, tally


def test_a_kill_not_reached_does_not_shift_the_later_kills_place_in_the_chain(tmp_path):
    # the first kill was not reached (the run finished), the two recovery kills were
    o = Outcome(3, "payments", "aligned", ["snapshot:8", "restore:2", "external@20s"],
                kills=["restore", "flush_merge"], nth=[1, 2], not_reached=["snapshot:8"], survived=True)
    record(tmp_path / "r.jsonl", o)
    (back,) = load(tmp_path / "r.jsonl")
    t = tally([back])
    assert (t.kills, t.recovery_kills, t.not_reached, t.mismatches) == (2, 2, 1, 0)
    assert t.by_phase["restore"]["recovery"] == 1 and t.by_phase["restore"]["precise"] == 1
    assert t.by_phase["flush_merge"]["external"] == 1 and not t.by_phase["flush_merge"]["first"]
    assert "| 1 | 2 | 2 | 1 | 1 | **0** |" in render([back])


def test_scenarios_are_deterministic_and_chain_up_to_three_recovery_kills():
    drawn = [scenario(seed) for seed in range(200)]
    assert drawn == [scenario(seed) for seed in range(200)]
    assert {len(s.then) for s in drawn} == {0, 1, 2, 3}
    assert all(s.chain[0] == s.first for s in drawn)


def test_the_generated_page_names_the_whole_command_and_the_scenarios_run_before():
    """docs/reliability.md said `--runs 41` for a run of 41 payments/transfers and 41 orders seeds
    at 2 jobs, and took the minutes of the last invocation for the whole table."""
    import argparse

    from run_chaos import command_of, generated

    from chaos_harness import ENRICHMENT_SEEDS, ORDERS_SEEDS, PG_SEEDS, STATE_SEEDS

    args = argparse.Namespace(runs=41, first_seed=0, orders_runs=41, orders_first_seed=ORDERS_SEEDS, jobs=2, skip_hostile=False, skip_races=False,
                              enrichment_runs=40, enrichment_first_seed=ENRICHMENT_SEEDS, enrichment_groups_runs=8,
                              state_runs=0, state_first_seed=STATE_SEEDS, pg_runs=0, pg_first_seed=PG_SEEDS,
                              results="tests/chaos/results.jsonl")
    assert command_of(args) == ('make chaos CHAOS_ARGS="--runs 41 --orders-runs 41 --enrichment-runs 40 '
                                '--enrichment-groups-runs 8 --jobs 2"')
    args.state_runs, args.state_first_seed = 20, STATE_SEEDS + 20
    assert command_of(args).endswith(f'--enrichment-groups-runs 8 --state-runs 20 --state-first-seed {STATE_SEEDS + 20} --jobs 2"')
    args.state_runs, args.state_first_seed = 0, STATE_SEEDS
    args.skip_races = True
    assert command_of(args).endswith('--jobs 2 --skip-races"')
    args.pg_runs = 15
    assert command_of(args).endswith('--enrichment-groups-runs 8 --pg-runs 15 --jobs 2 --skip-races"')
    text = generated([], [], args, 600.0, kept=46)
    assert "this invocation took 10 min (46 of the scenarios below were run by earlier invocations" in text


def test_per_vertex_scenarios_kill_each_process_group_and_recoveries_in_the_first():
    from chaos_harness import ENRICHMENT_GROUPS_SEEDS, GROUP_KILLS, enrichment_groups

    groups = enrichment_groups()
    assert groups == ("sources", "tag", "dedup", "totals")
    drawn = [scenario(seed) for seed in range(ENRICHMENT_GROUPS_SEEDS, ENRICHMENT_GROUPS_SEEDS + 40)]
    assert {s.groups[0] for s in drawn} == set(groups)  # the first kill lands in every process in turn
    for s in drawn:
        assert s.pipeline == "enrichment" and s.mode in ("aligned", "unaligned") and len(s.groups) == len(s.chain)
        kills = GROUP_KILLS["sources" if s.groups[0] == "sources" else "operators"]
        assert s.first.phase == "external" or s.first.phase in kills
        assert s.first.phase != "channel_state" or s.mode == "unaligned"
        assert all(g == "sources" for k, g in zip(s.then, s.groups[1:]) if k.phase in ("recover", "restore"))
        assert s.label.startswith(f"#{s.seed} enrichment/{s.mode}, a process per vertex: {s.kills[0]}")
        assert all("@" in k for k in s.kills)


def test_a_first_kill_is_drawn_within_the_hits_its_layout_reaches():
    """Chained, the keyed operator snapshots and acknowledges once per checkpoint (4 times in a
    3-version run, traced with CKPT_PHASE_TRACE), not once per keyed subtask (12 unchained): a
    chained `snapshot:8` was never reached and counted nothing."""
    from chaos_harness import CHAINED_KILLS, FIRST_KILLS, ORDERS_SEEDS

    drawn = [scenario(seed) for seed in (*range(400), *range(ORDERS_SEEDS, ORDERS_SEEDS + 200))]
    chained = [s for s in drawn if s.chained and s.first.phase in CHAINED_KILLS]
    assert chained and all(s.first.n <= CHAINED_KILLS[s.first.phase] for s in chained)
    unchained = [s.first.n for s in drawn if not s.chained and s.first.phase == "snapshot"]
    assert max(unchained) > CHAINED_KILLS["snapshot"] and max(unchained) <= FIRST_KILLS["snapshot"]


def test_state_scenarios_fold_the_state_and_half_are_killed_inside_a_fold():
    """A 3-version run never folds the keyed state at the default (every 32 flushes), so the
    STATE_SEEDS scenarios fold it every 1 or 2 flushes and draw ``state_compact`` within the folds
    such a run reaches, or (a fifth) ``state_run``, between a run's files and their commit; the rest
    of each is the scenario of the seed it is drawn from."""
    from chaos_harness import FIRST_KILLS, ORDERS_SEEDS, STATE_FOLDS, STATE_SEEDS, _command

    drawn = [scenario(seed) for seed in range(STATE_SEEDS, STATE_SEEDS + 120)]
    assert {s.compact_every for s in drawn} == set(STATE_FOLDS)
    folded = [s for s in drawn if s.first.phase == "state_compact"]
    assert 40 <= len(folded) <= 80
    assert all(1 <= s.first.n <= STATE_FOLDS[s.compact_every] for s in folded)
    runs = [s for s in drawn if s.first.phase == "state_run"]
    assert 12 <= len(runs) <= 36 and all(1 <= s.first.n <= FIRST_KILLS["flush_merge"] for s in runs)
    assert {s.pipeline for s in drawn} == {"payments", "transfers", "orders"}
    for s in drawn:
        base = scenario(ORDERS_SEEDS + s.seed - STATE_SEEDS if (s.seed - STATE_SEEDS) % 3 == 2 else s.seed - STATE_SEEDS)
        assert (s.pipeline, s.mode, s.lagging, s.then) == (base.pipeline, base.mode, base.lagging, base.then)
        assert s.first in (base.first, Kill("state_compact", s.first.n), Kill("state_run", s.first.n))
        command = _command("/w", s)
        assert command[command.index("--state-compact-every") + 1] == str(s.compact_every)
        assert f"state folded every {s.compact_every} flush" in s.label
    assert scenario(STATE_SEEDS + 5) == scenario(STATE_SEEDS + 5)
