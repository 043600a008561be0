"""The ``enrichment`` example's data (no JVM): the generator keeps the landing rule and lands every
kind of case, the accounts' change feed is in the Delta log (delta-rs writes change data files),
and the verifier accepts exactly the outputs it expects.

The landing rule and the kinds are read here from the two tables' Delta logs themselves (commit
stamps, ``_change_data`` files), not through the module's own readers, and the as-of lookup is
done again by brute force, so the verifier is checked against a second derivation."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from checkpoint_lib.delta.log import commit_actions, latest_version
from checkpoint_lib.pipelines import enrichment_data as E
from checkpoint_lib.verify import rows_in_offset_order

ROUND_STEP = (E.ROUND_KEY, E.STEP_KEY)


@pytest.fixture(scope="module")
def landed(tmp_path_factory) -> Path:
    """Five rounds in two calls (the second goes on from the first), 50 accounts, 200 payments a round."""
    w = tmp_path_factory.mktemp("enrichment")
    first = E.generate(None, str(w), 600, rounds=3, accounts=50, seed=11)
    assert first == latest_version(w / E.PAYMENTS_PATH)
    E.generate(None, str(w), 400, rounds=2, accounts=50, seed=12)
    return w


@pytest.fixture
def warehouse(landed, tmp_path) -> Path:
    """A copy of the landing tables, this test's own."""
    shutil.copytree(landed / "landing", tmp_path / "landing")
    return tmp_path


def _stamp(actions: list[dict]) -> tuple[int, int]:
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    return info[E.ROUND_KEY], info[E.STEP_KEY]


def _read_log(w: Path) -> tuple[pd.DataFrame, pd.DataFrame, list[list[dict]]]:
    """(changes, payments, the accounts table's commits) straight from the Delta logs: the changes
    from each commit's ``cdc`` files (its added files when it has none), each row with the landing
    order of its commit (``rank``) over both tables, ``late`` as this test defines it."""
    accounts, payments = w / E.ACCOUNTS_PATH, w / E.PAYMENTS_PATH
    commits = [list(commit_actions(accounts, v)) for v in range(latest_version(accounts) + 1)]
    frames = []
    for version, actions in enumerate(commits):
        cdc = [a["cdc"]["path"] for a in actions if "cdc" in a]
        if cdc:
            rows = pd.concat([pq.read_table(accounts / p).to_pandas() for p in cdc], ignore_index=True)
            rows = rows[rows["_change_type"].isin(["insert", "update_postimage", "delete"])]
        else:
            adds = [a["add"]["path"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
            rows = pd.concat([pq.read_table(accounts / p).to_pandas() for p in adds] or [pd.DataFrame()],
                             ignore_index=True).assign(_change_type="insert")
        frames.append(rows.assign(version=version, stamp=[_stamp(actions)] * len(rows)))
    changes = pd.concat(frames, ignore_index=True)
    landing = rows_in_offset_order(payments)
    stamps = {v: _stamp(list(commit_actions(payments, v))) for v in landing["src_version"].unique()}
    landing["stamp"] = landing["src_version"].map(stamps)
    order = {s: i for i, s in enumerate(sorted(set(changes["stamp"]) | set(landing["stamp"])))}
    for frame in (changes, landing):
        frame["rank"] = frame["stamp"].map(order).astype("int64")
        frame["round"] = frame["stamp"].map(lambda s: s[0])
    for frame, column in ((changes, "updated_at"), (landing, "ts")):
        frame["us"] = pd.to_datetime(frame[column], utc=True).dt.as_unit("us").astype("int64")
    changes = changes.sort_values(["rank"], kind="stable").reset_index(drop=True)
    newest: dict[str, int] = {}
    late = []
    for row in changes.itertuples():
        late.append(row.us < newest.get(row.account, row.us))
        newest[row.account] = max(row.us, newest.get(row.account, row.us))
    changes["late"] = late
    return changes, landing, commits


def test_the_accounts_change_feed_is_written_by_delta_rs(landed):
    """The table has the change data feed on, and every commit that changed or removed rows wrote
    change data files (``cdc`` actions) that say so."""
    table = DeltaTable(str(landed / E.ACCOUNTS_PATH))
    assert table.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    changes, _, commits = _read_log(landed)
    for actions in commits:
        operation = next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a)
        if any("remove" in a for a in actions):
            assert any("cdc" in a for a in actions), operation
    kinds = set(changes["_change_type"])
    assert kinds == {"insert", "update_postimage", "delete"}
    # the module's reader (load_cdf) sees the same changes as the log's files
    ours = E.account_changes(str(landed))
    assert len(ours) == len(changes) and int(ours["deleted"].sum()) == int((changes["_change_type"] == "delete").sum())
    # one row per account, always
    assert not table.to_pandas()["account"].duplicated().any()


def test_the_landing_rule_holds(landed):
    """For every payment, every (not late) change with updated_at <= ts landed in an earlier commit
    and no change with updated_at > ts did; for a payment landed again, of its own account."""
    changes, landing, _ = _read_log(landed)
    stamps = list(changes.drop_duplicates("version")["stamp"]) + list(landing.drop_duplicates("src_version")["stamp"])
    assert len(stamps) == len(set(stamps)), "each commit has its own place in the landing order"
    ranks = list(changes.drop_duplicates("version")["rank"])
    assert ranks == sorted(ranks), "the accounts table's versions follow the landing order"
    rows = landing[landing["account"].notna() & (landing["account"].astype(str).str.strip() != "")]
    first = (rows["event_id"].isna() | ~rows["event_id"].duplicated()).to_numpy()
    ts, ps, pacct = rows["us"].to_numpy(), rows["rank"].to_numpy(), rows["account"].to_numpy()
    u, cs, cacct, late = (changes[c].to_numpy() for c in ("us", "rank", "account", "late"))
    valid = u[None, :] <= ts[:, None]
    earlier = cs[None, :] < ps[:, None]
    scope = first[:, None] | (pacct[:, None] == cacct[None, :])
    assert not (valid & ~earlier & ~late[None, :] & scope).any(), "a change valid at a payment landed after it"
    assert not (~valid & earlier & scope).any(), "a change valid after a payment landed before it"
    # the windows: changes in the first half of their round, payments in the second
    start = E.EPOCH_US + changes["round"].to_numpy() * E.ROUND_US
    on_time = ~late
    assert ((u[on_time] >= start[on_time]) & (u[on_time] < start[on_time] + E.ROUND_US // 2)).all()
    first_rows = rows[first]
    pstart = E.EPOCH_US + first_rows["round"].to_numpy() * E.ROUND_US + E.ROUND_US // 2
    assert ((first_rows["us"].to_numpy() >= pstart) & (first_rows["us"].to_numpy() < pstart + E.ROUND_US // 2)).all()
    # a payment landed again is the same row
    again = landing[landing["event_id"].notna() & landing["event_id"].duplicated(keep=False)]
    assert (again.groupby("event_id")[["account", "amount_cents", "us"]].nunique() == 1).all().all()


def _brute_force(changes: pd.DataFrame, rows: pd.DataFrame) -> np.ndarray:
    """For each payment row, the change of its account with the greatest (updated_at, landing
    order) at or before its ts, as an index into ``changes`` (-1: none), over every pair."""
    u, cs, cacct = (changes[c].to_numpy() for c in ("us", "rank", "account"))
    ts, pacct = rows["us"].to_numpy(), rows["account"].to_numpy()
    mask = (u[None, :] <= ts[:, None]) & (pacct[:, None] == cacct[None, :])
    key = np.where(mask, (u[None, :] - E.EPOCH_US) * 10_000 + cs[None, :], -1)
    return np.where(mask.any(axis=1), key.argmax(axis=1), -1)


def test_late_changes_never_win_and_the_verifier_agrees_with_a_brute_force_lookup(landed):
    changes, landing, _ = _read_log(landed)
    ok = ~(landing["event_id"].isna() | landing["account"].isna() | (landing["account"].astype(str).str.strip() == "")
           | landing["amount_cents"].isna())
    rows = landing[ok].reset_index(drop=True)
    chosen = _brute_force(changes, rows)
    assert not changes["late"].to_numpy()[chosen[chosen >= 0]].any(), "a late change would decide a payment"
    kind = np.array(["none"] * len(rows), dtype=object)
    picked = changes.iloc[chosen[chosen >= 0]]
    kind[chosen >= 0] = np.where(picked["_change_type"] == "delete", "none",
                                 np.where(picked["status"] == E.CLOSED, "closed", "open"))
    region = np.array([None] * len(rows), dtype=object)
    region[chosen >= 0] = picked["region"].to_numpy()
    rows = rows.assign(kind=kind, region=region)
    want = E.expected_enrichment(str(landed))
    accepted = rows[rows["kind"] == "open"]
    assert sorted(zip(want["tagged"]["event_id"], want["tagged"]["region"])) == sorted(
        set(zip(accepted["event_id"], accepted["region"])))
    reasons = want["rejected"]["reason"].value_counts().to_dict()
    assert reasons == {E.UNKNOWN_ACCOUNT: int((rows["kind"] == "none").sum()),
                       E.CLOSED_ACCOUNT: int((rows["kind"] == "closed").sum())}
    assert len(want["duplicates"]) == len(accepted) - accepted["event_id"].nunique()
    assert len(want["dead_letters"]) == int((~ok).sum())
    # every landed row is exactly one of: tagged, a duplicate, rejected, a dead letter
    assert len(landing) == sum(len(want[k]) for k in ("tagged", "duplicates", "rejected", "dead_letters"))
    totals = want["tagged"].groupby("region")["amount_cents"].agg(["sum", "size"])
    got = want["region_totals"].set_index("region")
    assert (got["total_cents"] == totals["sum"]).all() and (got["payment_count"] == totals["size"]).all()


def test_every_kind_of_case_lands(landed):
    changes, landing, _ = _read_log(landed)
    want = E.expected_enrichment(str(landed))
    kinds = changes["_change_type"]
    assert changes["late"].sum() >= 2, "late changes"
    assert (kinds == "delete").sum() >= 2, "removed accounts"
    assert (changes["status"] == E.CLOSED).any(), "closed accounts"
    on_time = changes[~changes["late"] & (kinds != "delete")]
    assert (on_time.groupby("account")["region"].nunique() > 1).any(), "moves"
    # the payments
    dead = want["dead_letters"]
    assert dead["account"].isna().any(), "bad rows with a null account"
    rejected = want["rejected"]
    opened = set(changes["account"])
    assert (~rejected["account"].isin(opened)).any(), "payments of accounts never opened"
    removed = set(changes.loc[kinds == "delete", "account"])
    assert (rejected["account"].isin(removed) & (rejected["reason"] == E.UNKNOWN_ACCOUNT)).any(), "of removed ones"
    assert (rejected["reason"] == E.CLOSED_ACCOUNT).any(), "of closed ones"
    assert rejected["event_id"].duplicated().any(), "a rejected payment landed twice is rejected twice"
    tagged = want["tagged"]
    assert (tagged.groupby("account")["region"].nunique() > 1).any(), "an account tagged before and after a move"
    assert set(tagged["account"]) & set(rejected["account"]), "an account accepted, then rejected"
    # duplicates: in a later commit of the same round and of a later round
    copies = landing[landing["event_id"].notna()]
    first = copies.drop_duplicates("event_id").set_index("event_id")
    again = copies[copies["event_id"].duplicated()]
    assert len(want["duplicates"]) > 0
    assert (again["src_version"].to_numpy() > first.loc[again["event_id"], "src_version"].to_numpy()).all()
    same_round = again["round"].to_numpy() == first.loc[again["event_id"], "round"].to_numpy()
    assert same_round.any() and (~same_round).any()


def _write(w: Path, path: str, frame: pd.DataFrame, schema) -> None:
    names = [n for n, _ in schema] if not isinstance(schema, dict) else list(schema)
    table = pa.Table.from_pandas(frame[names], schema=E.arrow_schema(schema), preserve_index=False)
    write_deltalake(str(w / path), table, mode="overwrite")


def _write_outputs(w: Path, want: dict[str, pd.DataFrame]) -> None:
    """What the pipeline (and the runtime's dead letters) would write."""
    _write(w, E.TAGGED_PATH, want["tagged"], E.TAGGED_SCHEMA)
    _write(w, E.REGION_TOTALS_PATH, want["region_totals"], E.REGION_TOTALS_SCHEMA)
    _write(w, E.REJECTED_PATH, want["rejected"], E.REJECTED_SCHEMA)
    dead = want["dead_letters"].assign(_ckpt_error="bad row")
    _write(w, E.DEAD_LETTERS_PATH, dead, {**E.PAYMENTS_SCHEMA, "_ckpt_error": "string"})


def test_the_expected_outputs_pass(warehouse):
    want = E.expected_enrichment(str(warehouse))
    _write_outputs(warehouse, want)
    check = E.check_enrichment(str(warehouse))
    assert check.ok, check.summary()
    assert check.landed_rows == len(want["landing"]) == 1000
    assert check.tagged_rows == len(want["tagged"]) and check.dead_letters == len(want["dead_letters"])
    assert "exact" in check.summary()


def _drop_tagged(want):
    want["tagged"] = want["tagged"].drop(index=7)


def _repeat_tagged(want):
    want["tagged"] = pd.concat([want["tagged"], want["tagged"].iloc[[5]]], ignore_index=True)


def _wrong_region(want):
    t = want["tagged"]
    t.loc[3, "region"] = next(r for r in E.REGIONS if r != t.loc[3, "region"])


def _later_ts(want):
    want["tagged"].loc[2, "ts"] += pd.Timedelta(microseconds=1)


def _wrong_total(want):
    want["region_totals"].loc[0, "total_cents"] += 1


def _wrong_count(want):
    want["region_totals"].loc[1, "payment_count"] -= 1


def _drop_rejected(want):
    want["rejected"] = want["rejected"].drop(index=0)


def _wrong_reason(want):
    r = want["rejected"]
    r.loc[0, "reason"] = E.CLOSED_ACCOUNT if r.loc[0, "reason"] == E.UNKNOWN_ACCOUNT else E.UNKNOWN_ACCOUNT


def _drop_dead_letter(want):
    want["dead_letters"] = want["dead_letters"].iloc[1:]


@pytest.mark.parametrize("spoil, table, words", [
    (_drop_tagged, E.TAGGED_PATH, "expected rows missing"),
    (_repeat_tagged, E.TAGGED_PATH, "more often than expected"),
    (_wrong_region, E.TAGGED_PATH, "wrong region"),
    (_later_ts, E.TAGGED_PATH, "wrong ts"),
    (_wrong_total, E.REGION_TOTALS_PATH, "wrong total_cents"),
    (_wrong_count, E.REGION_TOTALS_PATH, "wrong payment_count"),
    (_drop_rejected, E.REJECTED_PATH, "expected rows missing"),
    (_wrong_reason, E.REJECTED_PATH, "expected rows missing"),
    (_drop_dead_letter, E.DEAD_LETTERS_PATH, "expected the"),
], ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_a_wrong_output_fails_naming_its_table(warehouse, spoil, table, words):
    want = E.expected_enrichment(str(warehouse))
    spoil(want)
    _write_outputs(warehouse, want)
    check = E.check_enrichment(str(warehouse))
    assert not check.ok
    assert len(check.problems) == 1, check.summary()
    assert check.problems[0].startswith(f"{table}: ") and words in check.problems[0], check.summary()


def test_missing_outputs_fail_naming_each_table(warehouse):
    check = E.check_enrichment(str(warehouse))
    assert not check.ok
    for path in (E.TAGGED_PATH, E.REGION_TOTALS_PATH, E.REJECTED_PATH, E.DEAD_LETTERS_PATH):
        assert any(p.startswith(f"{path}: ") for p in check.problems), check.summary()


def test_timestamps_compare_to_the_microsecond():
    want = pd.DataFrame({"event_id": ["e"], "account": ["a"], "amount_cents": [5], "region": ["eu-west"],
                         "ts": pd.to_datetime(["2026-01-01T00:30:00.000001Z"])})
    finer = want.assign(ts=want["ts"].dt.as_unit("ns") + pd.Timedelta(nanoseconds=999))
    assert E.compare_rows("t", finer, want, E.TAGGED_SCHEMA, key="event_id") == []
    later = want.assign(ts=want["ts"] + pd.Timedelta(microseconds=1))
    assert E.compare_rows("t", later, want, E.TAGGED_SCHEMA, key="event_id") == [
        "t: 1 rows have a wrong ts, e.g. event_id 'e': 2026-01-01T00:30:00.000002+00:00 instead of "
        "2026-01-01T00:30:00.000001+00:00"]


def test_an_empty_warehouse_expects_nothing(tmp_path):
    want = E.expected_enrichment(str(tmp_path))
    assert all(len(want[k]) == 0 for k in ("tagged", "region_totals", "rejected", "dead_letters", "duplicates"))
    assert E.check_enrichment(str(tmp_path)).ok


def test_the_same_seed_lands_the_same_data(tmp_path):
    for name in ("a", "b"):
        E.generate(None, str(tmp_path / name), 120, rounds=3, accounts=12, seed=5)
    landing = [E.expected_enrichment(str(tmp_path / n))["landing"].drop(columns="src_file") for n in ("a", "b")]
    changes = [E.account_changes(str(tmp_path / n)) for n in ("a", "b")]
    assert landing[0].equals(landing[1]) and changes[0].equals(changes[1]) and len(changes[0]) > 12


def test_the_generator_refuses_bad_options(tmp_path):
    for options in ({"rounds": 0}, {"accounts": 0}, {"bad_fraction": 1.5}, {"duplicate_fraction": -0.1}):
        with pytest.raises(ValueError):
            E.generate(None, str(tmp_path), 10, **options)
    with pytest.raises(ValueError):
        E.generate(None, str(tmp_path), 0)
    write_deltalake(str(tmp_path / E.ACCOUNTS_PATH), pa.Table.from_pylist([], schema=E.arrow_schema(E.ACCOUNTS_SCHEMA)))
    with pytest.raises(ValueError, match="change data feed"):
        E.generate(None, str(tmp_path), 10)


def test_a_tie_goes_to_the_later_commit_and_within_one_to_its_post_image():
    """The verifier's as-of lookup: two changes with one ``updated_at`` resolve by commit order, and
    within one commit (an overwrite deletes and inserts every row again) the row after it wins,
    whatever order the feed lists them in."""
    import pandas as pd

    t = pd.Timestamp("2026-01-01 10:00", tz="UTC")
    changes = pd.DataFrame({"account": ["a", "a", "b", "b"], "region": ["eu", "eu", "us", "us"],
                            "status": ["open"] * 4, "updated_at": pd.Series([t] * 4, dtype="datetime64[us, UTC]"),
                            "deleted": [False, True, False, True], "version": [3, 3, 3, 4]})
    payments = pd.DataFrame({"account": ["a", "b"], "ts": [t + pd.Timedelta(hours=1)] * 2})
    looked = E._as_of(payments, changes)
    assert looked["deleted"].tolist() == [False, True] and looked["found"].tolist() == [True, True]
