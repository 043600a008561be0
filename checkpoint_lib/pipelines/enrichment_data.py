"""The data of the ``enrichment`` example: its landing tables (schemas and a generator) and an
independent check of its outputs. pandas, pyarrow and delta-rs only: no Spark, no JVM.

The pipeline (``enrichment.py``) tags each payment with its account's region as of the payment,
read from a dimension table through its Delta change data feed, drops repeated events and keeps
running totals per region.

Tables (paths under the warehouse; types in the schema notation of ``payments.py``):

- ``landing/enrichment/payments`` (:data:`PAYMENTS_SCHEMA`): append-only payment events.
- ``landing/enrichment/accounts`` (:data:`ACCOUNTS_SCHEMA`): one row per account, changed in place,
  created with ``delta.enableChangeDataFeed=true``: an account is opened (insert, status ``open``),
  moved (update of ``region`` and ``updated_at``), closed (update, status ``closed``) or removed
  (delete). delta-rs writes the change data files (``_change_data/``, ``cdc`` actions) of its
  MERGE and DELETE, so Spark's ``readChangeFeed`` and delta-rs' ``load_cdf`` both read the changes.
- ``gold/enrichment/tagged`` (:data:`TAGGED_SCHEMA`, append), ``gold/enrichment/region_totals``
  (:data:`REGION_TOTALS_SCHEMA`, upsert by region), ``dlq/enrichment/rejected``
  (:data:`REJECTED_SCHEMA`, append), written by the pipeline; ``dlq/enrichment/payments``: the
  source's dead letters (bad rows), written by the runtime.

What the outputs must be (the verifier's semantics, whatever steps the pipeline is cut into):

- A change of the accounts table (an ``insert``, ``update_postimage`` or ``delete`` row of its change
  feed) is valid from its ``updated_at``; a delete's ``updated_at`` is that of the row it removed
  (the generator sets it to the removal time first: an update, then the delete in a later commit).
  The account as of time ``t`` is its change with the greatest ``updated_at <= t``, a later commit
  winning a tie; after a delete the account does not exist. A *late* change (landed after a change
  of the same account with a greater ``updated_at``) therefore never wins over that newer one.
- A landed payment row with a null ``event_id``, a null or blank ``account`` or a null
  ``amount_cents`` is a source dead letter (the reasons of ``payments.payment_errors``). Every other
  row is looked up as of its ``ts``: no change (or a null ``ts``), or a delete -> rejected,
  ``"unknown account"``; status ``closed`` -> rejected, ``"closed account"``; else accepted with that
  region. Rejected rows are kept per landed row (a payment landed twice is rejected twice).
- Accepted rows are deduplicated by ``event_id`` (the first in source-offset order: version, file,
  row): ``tagged`` has one row per accepted event; ``region_totals`` is, per region, the sum of
  ``amount_cents`` and the count of the tagged rows. So every landed payment row is exactly one of:
  tagged, a duplicate dropped, rejected, a source dead letter.

The landing rule :func:`generate` keeps, which a pipeline may rely on: event time is cut into
rounds of an hour; in round ``k`` the accounts changes with ``updated_at`` in the first half of the
window land first, then the payments with ``ts`` in its second half. So for every payment, every
change with ``updated_at <= ts`` landed in an earlier commit and none with ``updated_at > ts`` did,
with two exceptions: a *late* change (its ``updated_at`` lies between the window's start and the
account's newest change, where no payment falls, so it never wins) and a payment landed again in a
later round (only of an account no change of which landed since the first copy, so the rule holds
for that account). Every commit the generator makes carries its landing order in the commit info
(``enrichment.round``, ``enrichment.step``), which the tests read; the pipeline needs it not.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from ..delta import log as delta_log
from ..layout import location, warehouse_location
from ..schema import columns
from .payments import account_digits

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

PAYMENTS_PATH = "landing/enrichment/payments"
ACCOUNTS_PATH = "landing/enrichment/accounts"
TAGGED_PATH = "gold/enrichment/tagged"
REGION_TOTALS_PATH = "gold/enrichment/region_totals"
REJECTED_PATH = "dlq/enrichment/rejected"
DEAD_LETTERS_PATH = "dlq/enrichment/payments"

PAYMENTS_SCHEMA = {"event_id": "string", "account": "string", "amount_cents": "long", "ts": "timestamp"}
ACCOUNTS_SCHEMA = {"account": "string", "region": "string", "status": "string", "updated_at": "timestamp"}
TAGGED_SCHEMA = (
    ("event_id", "string"), ("account", "string"), ("amount_cents", "long"), ("ts", "timestamp"), ("region", "string"),
)
REGION_TOTALS_SCHEMA = (("region", "string"), ("total_cents", "long"), ("payment_count", "long"))
REJECTED_SCHEMA = (
    ("event_id", "string"), ("account", "string"), ("amount_cents", "long"), ("ts", "timestamp"), ("reason", "string"),
)

OPEN, CLOSED = "open", "closed"
UNKNOWN_ACCOUNT, CLOSED_ACCOUNT = "unknown account", "closed account"
REGIONS = ("eu-west", "us-east", "ap-south", "sa-east")

EPOCH_US = 1_767_225_600_000_000
"""2026-01-01T00:00:00Z in microseconds: the start of round 0."""
ROUND_US = 3_600_000_000
"""A round's window of event time (an hour): changes in its first half, payments in its second."""
ROUND_KEY, STEP_KEY = "enrichment.round", "enrichment.step"
"""The commit info keys of a generated commit's landing order: (round, step) over both tables."""

_CHANGE_TYPES = ("insert", "update_postimage", "delete")
_ARROW_TYPES = {"string": "string", "long": "int64", "bigint": "int64"}


def arrow_schema(spec: Any) -> pa.Schema:
    """A schema of this module (string, long and timestamp columns) as pyarrow, as Spark writes
    it: ``timestamp`` is microseconds in UTC, every column nullable."""
    import pyarrow as pa

    def arrow_type(name: str, type_: str) -> pa.DataType:
        if type_ == "timestamp":
            return pa.timestamp("us", tz="UTC")
        if type_ not in _ARROW_TYPES:
            raise ValueError(f"column {name!r}: type {type_!r} is not one of string, long, timestamp")
        return getattr(pa, _ARROW_TYPES[type_])()

    return pa.schema([pa.field(name, arrow_type(name, type_)) for name, type_ in columns(spec)])


def _root(warehouse: str) -> Any:
    return location(warehouse_location(warehouse))


# -- reading the accounts' changes --------------------------------------------------------------

def account_changes(warehouse: str) -> pd.DataFrame:
    """Every change of ``landing/enrichment/accounts``, read from its change data feed (delta-rs
    ``load_cdf``: its ``insert``, ``update_postimage`` and ``delete`` rows), in commit order, then by
    account: ``account``, ``region``, ``status``, ``updated_at``, ``deleted`` (a delete: the account
    does not exist from that ``updated_at``) and ``version`` (the commit). Empty when the table does
    not exist."""
    return _changes_of(_root(warehouse) / ACCOUNTS_PATH)


def _changes_of(path: Any) -> pd.DataFrame:
    import pandas as pd
    import pyarrow as pa
    from deltalake import DeltaTable

    names = [n for n, _ in columns(ACCOUNTS_SCHEMA)]
    if not delta_log.is_delta_table(path):
        frame = pd.DataFrame({n: pd.Series(dtype=object) for n in names})
        frame["updated_at"] = pd.Series(dtype="datetime64[us, UTC]")
        frame["deleted"], frame["version"] = pd.Series(dtype=bool), pd.Series(dtype="int64")
        return frame
    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=0)).to_pandas()
    feed = feed[feed["_change_type"].isin(_CHANGE_TYPES)]
    out = pd.DataFrame({n: feed[n].astype(object).where(feed[n].notna(), None) for n in ("account", "region", "status")})
    out["updated_at"] = _micros_ts(feed["updated_at"])
    out["deleted"] = (feed["_change_type"] == "delete").to_numpy()
    out["version"] = feed["_commit_version"].astype("int64").to_numpy()
    return out.sort_values(["version", "account"], kind="stable").reset_index(drop=True)


def _micros_ts(values: Any) -> pd.Series:
    """Timestamps as ``datetime64[us, UTC]``, cut to the microsecond."""
    import pandas as pd

    return pd.to_datetime(pd.Series(values), utc=True).dt.floor("us").dt.as_unit("us")


def _as_of(payments: pd.DataFrame, changes: pd.DataFrame) -> pd.DataFrame:
    """``payments`` (``account``, ``ts``) with the account as of each ``ts``: ``found``, ``region``,
    ``status``, ``deleted``; in the order given."""
    import pandas as pd

    left = payments[["account", "ts"]].copy()
    left["ts"] = _micros_ts(left["ts"])
    left["_row"] = range(len(left))
    # a tie: the later commit wins, and within one commit its post-image (an insert or update wins
    # over a delete of the same row: a commit that rewrote files whole, an overwrite, deletes and
    # inserts every row of them again)
    right = changes[changes["updated_at"].notna()].assign(_post=lambda f: ~f["deleted"].astype(bool))
    right = right.sort_values(["updated_at", "version", "_post"], kind="stable")
    right = right.drop_duplicates(["account", "updated_at"], keep="last")
    right = right[["account", "updated_at", "region", "status", "deleted"]].assign(found=True)
    timed = left[left["ts"].notna()].sort_values("ts", kind="stable")
    looked = pd.merge_asof(timed, right, left_on="ts", right_on="updated_at", by="account",
                           direction="backward", allow_exact_matches=True)
    if left["ts"].isna().any():  # no time, no account
        looked = pd.concat([looked, left[left["ts"].isna()]], ignore_index=True)
    looked = looked.sort_values("_row")
    looked["found"] = looked["found"].astype("boolean").fillna(False).astype(bool).to_numpy()
    looked["deleted"] = looked["deleted"].astype("boolean").fillna(False).astype(bool).to_numpy()
    return looked.drop(columns=["_row", "updated_at"]).set_index(payments.index)


# -- what the outputs must be ---------------------------------------------------------------------

def _landing(warehouse: str) -> pd.DataFrame:
    import pandas as pd

    from ..verify import rows_in_offset_order

    rows = rows_in_offset_order(_root(warehouse) / PAYMENTS_PATH)
    if rows.empty:
        rows = pd.DataFrame(columns=[*PAYMENTS_SCHEMA, "src_version", "src_file", "src_row"])
    rows["ts"] = _micros_ts(rows["ts"])
    return rows.sort_values(["src_version", "src_file", "src_row"], kind="stable").reset_index(drop=True)


def bad_payments(landing: pd.DataFrame) -> pd.Series:
    """Which landed rows are source dead letters: a null ``event_id``, a null or blank ``account``,
    a null ``amount_cents`` (``payments.payment_errors``)."""
    account = landing["account"]
    return (landing["event_id"].isna() | account.isna() | (account.astype(str).str.strip() == "")
            | landing["amount_cents"].isna())


def expected_enrichment(warehouse: str) -> dict[str, pd.DataFrame]:
    """What exactly-once processing of the landing tables must produce: ``tagged``,
    ``region_totals`` and ``rejected`` (the outputs, their schemas' columns), ``dead_letters``
    (the bad landed rows, with their offsets: the runtime's DLQ holds as many) and ``duplicates``
    (the accepted rows dropped as repeats of an earlier one), and ``landing`` (every landed payment
    row, in source-offset order)."""
    return _expected(_landing(warehouse), account_changes(warehouse))


def _expected(landing: pd.DataFrame, changes: pd.DataFrame) -> dict[str, pd.DataFrame]:
    bad = bad_payments(landing)
    good = landing[~bad].copy()
    good["amount_cents"] = good["amount_cents"].astype("int64")
    account = _as_of(good, changes)
    unknown = ~account["found"] | account["deleted"]
    closed = ~unknown & (account["status"] == CLOSED)
    good["reason"] = None
    good.loc[unknown, "reason"] = UNKNOWN_ACCOUNT
    good.loc[closed, "reason"] = CLOSED_ACCOUNT
    good["region"] = account["region"].where(good["reason"].isna(), None)
    accepted = good[good["reason"].isna()]
    first = ~accepted["event_id"].duplicated()
    tagged = accepted[first][[n for n, _ in TAGGED_SCHEMA]].reset_index(drop=True)
    totals = (tagged.groupby("region").agg(total_cents=("amount_cents", "sum"), payment_count=("amount_cents", "size"))
              .reset_index().astype({"total_cents": "int64", "payment_count": "int64"}))
    rejected = good[good["reason"].notna()][[n for n, _ in REJECTED_SCHEMA]].reset_index(drop=True)
    return {"tagged": tagged, "region_totals": totals, "rejected": rejected,
            "dead_letters": landing[bad].reset_index(drop=True),
            "duplicates": accepted[~first].drop(columns=["reason"]).reset_index(drop=True),
            "landing": landing}


# -- the check ------------------------------------------------------------------------------------

@dataclass
class EnrichmentCheck:
    landed_rows: int
    account_changes: int
    tagged_rows: int  # expected
    duplicates: int
    rejected_rows: int  # expected
    dead_letters: int  # expected
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (f"{self.landed_rows} landed payments ({self.tagged_rows} tagged, {self.duplicates} duplicates, "
                f"{self.rejected_rows} rejected, {self.dead_letters} dead letters), "
                f"{self.account_changes} account changes")
        verdict = ": tagged, region totals, rejected and dead letters exact"
        return head + (verdict if self.ok else "\n  - " + "\n  - ".join(self.problems))


def check_enrichment(warehouse: str) -> EnrichmentCheck:
    """Compare ``gold/enrichment/tagged``, ``gold/enrichment/region_totals`` and
    ``dlq/enrichment/rejected`` with :func:`expected_enrichment` as multisets of rows (timestamps to
    the microsecond), and count ``dlq/enrichment/payments``. Each problem names its table."""
    root = _root(warehouse)
    changes = account_changes(warehouse)
    want = _expected(_landing(warehouse), changes)
    check = EnrichmentCheck(
        landed_rows=len(want["landing"]), account_changes=len(changes),
        tagged_rows=len(want["tagged"]), duplicates=len(want["duplicates"]),
        rejected_rows=len(want["rejected"]), dead_letters=len(want["dead_letters"]),
    )
    for name, path, schema, key in (
        ("tagged", TAGGED_PATH, TAGGED_SCHEMA, "event_id"),
        ("region_totals", REGION_TOTALS_PATH, REGION_TOTALS_SCHEMA, "region"),
        ("rejected", REJECTED_PATH, REJECTED_SCHEMA, None),
    ):
        check.problems += compare_rows(path, _read(root / path), want[name], schema, key=key)
    dlq = _read(root / DEAD_LETTERS_PATH)
    held = 0 if dlq is None else len(dlq)
    if held != check.dead_letters:
        check.problems.append(f"{DEAD_LETTERS_PATH}: holds {held} rows, expected the {check.dead_letters} bad "
                              "landed payments" + (" (the table does not exist)" if dlq is None else ""))
    return check


def _read(path: Any) -> pd.DataFrame | None:
    from ..verify import read_delta

    return read_delta(path) if delta_log.is_delta_table(path) else None


def compare_rows(name: str, got: pd.DataFrame | None, want: pd.DataFrame, schema: Any, *,
                 key: str | None = None) -> list[str]:
    """The differences between table ``name`` (``got``, None: it does not exist) and the rows it
    must hold, as multisets of the ``schema``'s columns (timestamps cut to the microsecond).
    ``key``: a column that names a row (``event_id``), so a row with a wrong value is reported as
    such rather than as one missing and one foreign row."""
    spec = columns(schema)
    if got is None:
        return [f"{name}: the table does not exist (expected {len(want)} rows)"] if len(want) else []
    lacking = [n for n, _ in spec if n not in got.columns]
    if lacking:
        return [f"{name}: lacks the columns {', '.join(lacking)}"]
    have, need = Counter(_rows(got, spec)), Counter(_rows(want, spec))
    missing, extra = need - have, have - need
    if not missing and not extra:
        return []
    problems = []
    repeated = Counter({row: n for row, n in extra.items() if row in need})
    if repeated:
        problems.append(f"{name}: {sum(repeated.values())} rows more often than expected, e.g. "
                        f"{_show(list(repeated)[:3], spec)}")
    extra -= repeated
    if key is not None:
        at = [n for n, _ in spec].index(key)
        lost = {row[at]: row for row in missing}
        foreign = {row[at]: row for row in extra}
        both = sorted(set(lost) & set(foreign), key=str)
        for i, (column, type_) in enumerate(spec):
            wrong = [k for k in both if lost[k][i] != foreign[k][i]]
            if wrong:
                k = wrong[0]
                problems.append(f"{name}: {len(wrong)} rows have a wrong {column}, e.g. {key} {k!r}: "
                                f"{_value(foreign[k][i], type_)} instead of {_value(lost[k][i], type_)}")
        missing = Counter({row: n for row, n in missing.items() if row[at] not in foreign})
        extra = Counter({row: n for row, n in extra.items() if row[at] not in lost})
    parts = [f"{sum(rows.values())} {what}, e.g. {_show(list(rows)[:3], spec)}"
             for rows, what in ((missing, "expected rows missing"), (extra, "unexpected rows")) if rows]
    if parts:
        problems.append(f"{name}: " + "; ".join(parts))
    return problems


def _rows(frame: pd.DataFrame, spec: tuple[tuple[str, str], ...]) -> list[tuple[Any, ...]]:
    """``frame``'s rows as tuples of plain values: None for a null, an int for a long, microseconds
    since the epoch for a timestamp, a str otherwise."""
    import pandas as pd

    values = []
    for name, type_ in spec:
        column = frame[name]
        if type_ == "timestamp":
            ts = _micros_ts(column)
            values.append([None if pd.isna(t) else int(t.value // 1000) for t in ts])
        elif type_ in ("long", "bigint"):
            values.append([None if pd.isna(v) else int(v) for v in column])
        else:
            values.append([None if pd.isna(v) else str(v) for v in column])
    return list(zip(*values)) if values else []


def _value(value: Any, type_: str) -> str:
    if value is not None and type_ == "timestamp":
        import pandas as pd

        return pd.Timestamp(value, unit="us", tz="UTC").isoformat()
    return repr(value)


def _show(rows: Iterable[tuple[Any, ...]], spec: tuple[tuple[str, str], ...]) -> str:
    return "; ".join("(" + ", ".join(_value(v, t) for v, (_, t) in zip(row, spec)) + ")" for row in rows)


# -- the generator --------------------------------------------------------------------------------

@dataclass
class _Account:
    """An account as of now (its change with the greatest ``updated_at``), as the generator keeps it."""
    region: str
    status: str
    updated_at: int  # microseconds since the epoch
    deleted: bool = False
    landed: tuple[int, int] = (-1, -1)  # (round, step) of the last commit that changed its row


def _account_name(number: int, accounts: int) -> str:
    return f"acct-{number:0{account_digits(accounts)}d}"


def _known(changes: pd.DataFrame) -> dict[str, _Account]:
    """Each account the change feed names, as of its newest change (what an earlier call left)."""
    known: dict[str, _Account] = {}
    ordered = changes[changes["updated_at"].notna()].sort_values(["updated_at", "version"], kind="stable")
    for row in ordered.itertuples(index=False):
        known[row.account] = _Account(row.region, row.status, int(row.updated_at.value // 1000), bool(row.deleted))
    return known


def _next_round(payments: Any, changes: pd.DataFrame) -> int:
    """The first round after everything already landed (0 on an empty warehouse)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    newest = [int(t.value // 1000) for t in changes["updated_at"].dropna()]
    if delta_log.is_delta_table(payments):
        ts = DeltaTable(str(payments)).to_pyarrow_table(columns=["ts"])["ts"]
        if len(ts) and pc.max(ts).is_valid:
            newest.append(pc.max(ts.cast("int64")).as_py())
    return 0 if not newest else (max(newest) - EPOCH_US) // ROUND_US + 1


def _commit(round_: int, step: int) -> Any:
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={ROUND_KEY: round_, STEP_KEY: step})


def generate(
    spark: Any,
    warehouse: str,
    rows: int,
    *,
    rounds: int = 4,
    accounts: int = 50,
    bad_fraction: float = 0.02,
    duplicate_fraction: float = 0.05,
    late_changes: int = 2,
    commits_per_round: int = 2,
    seed: int | None = None,
) -> int:
    """Land ``rounds`` more rounds of accounts changes and ``rows`` payment rows (spread evenly over
    the rounds) in ``warehouse/landing/enrichment/``, with delta-rs. Returns the payments table's
    new version. ``spark`` is not used (``ckpt generate``'s calling convention: it may be None).

    Each round, after what earlier calls landed (one hour of event time: changes in its first half,
    payments in its second):

    1. the accounts changes, in one MERGE (or two: opens, then updates) and a DELETE: opens (60% of
       the ``accounts`` ``acct-NNNNNN`` in the first round, the rest spread over the others), and
       from the accounts opened earlier: moves (~10% of the open ones: another region), closes
       (~4%), removals (~3% of the existing ones: ``updated_at`` set to the removal time in the MERGE,
       then the DELETE) and ``late_changes`` late changes (a move of an open account with an
       ``updated_at`` older than its newest change, in that change's half-hour: it never wins);
    2. the payments, in ``commits_per_round`` appends: fresh events of open accounts, and ~4% of
       never opened accounts, ~5% of closed ones, ~4% of removed ones; ``bad_fraction`` bad rows
       (mostly a null account; a blank account, a null amount, a null event id); and
       ``duplicate_fraction`` of the round's rows landed again, identical, in its last commit:
       copies of earlier commits of the round or of earlier rounds of this call (only of accounts
       no change of which landed since).
    """
    from deltalake import DeltaTable

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    for name, value in (("rounds", rounds), ("accounts", accounts), ("commits_per_round", commits_per_round)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if late_changes < 0:
        raise ValueError(f"late_changes must be >= 0, got {late_changes}")
    for name, fraction in (("bad_fraction", bad_fraction), ("duplicate_fraction", duplicate_fraction)):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"{name} must be within 0..1, got {fraction}")
    rng = random.Random(random.randrange(2**31) if seed is None else seed)
    root = _root(warehouse)
    payments_path, accounts_path = root / PAYMENTS_PATH, root / ACCOUNTS_PATH
    if delta_log.is_delta_table(accounts_path):
        config = DeltaTable(str(accounts_path)).metadata().configuration
        if str(config.get("delta.enableChangeDataFeed", "")).lower() != "true":
            raise ValueError(f"{accounts_path} has no change data feed (delta.enableChangeDataFeed=true): "
                             "its changes cannot be read; generate into a new warehouse")
    changes = _changes_of(accounts_path)
    known = _known(changes)
    first = _next_round(payments_path, changes)
    never = [a for a in (_account_name(n, accounts) for n in range(accounts)) if a not in known]
    rng.shuffle(never)
    strangers = [_account_name(n, accounts) for n in range(accounts, accounts + max(5, accounts // 5))]
    history: list[tuple[tuple[int, int], dict[str, Any]]] = []  # this call's well-formed payments
    for i in range(rounds):
        round_ = first + i
        share = rows // rounds + (1 if i < rows % rounds else 0)
        step = _land_changes(accounts_path, round_, known, never, rounds - i, late_changes, rng)
        _land_payments(payments_path, round_, step, share, known, strangers, history, rng,
                       bad_fraction=bad_fraction, duplicate_fraction=duplicate_fraction,
                       commits=commits_per_round)
    return delta_log.latest_version(payments_path) or 0


def _land_changes(path: Any, round_: int, known: dict[str, _Account], never: list[str], rounds_left: int,
                  late_changes: int, rng: random.Random) -> int:
    """Land round ``round_``'s accounts changes; returns the next step of the round."""
    import pyarrow as pa
    from deltalake import DeltaTable

    start = EPOCH_US + round_ * ROUND_US
    when = lambda: start + rng.randrange(1_000_000, ROUND_US // 2)  # noqa: E731  (>= 1 s into the window)
    before = list(known)  # opened in an earlier round
    if not before:
        opening = max(1, math.ceil(0.6 * len(never))) if never else 0
    else:
        opening = math.ceil(len(never) / rounds_left) if never else 0
    opens, never[:] = never[:opening], never[opening:]
    open_ = [a for a in before if not known[a].deleted and known[a].status == OPEN]
    existing = [a for a in before if not known[a].deleted]
    rng.shuffle(open_)
    moves = open_[:round(0.10 * len(open_))]
    closes = open_[len(moves):len(moves) + max(1, round(0.04 * len(open_)))] if len(open_) > 3 else []
    busy = set(moves) | set(closes)
    removable = [a for a in existing if a not in busy]
    rng.shuffle(removable)
    removes = removable[:max(1, round(0.03 * len(existing)))] if len(existing) > 3 else []
    busy |= set(removes)
    late = [a for a in open_ if a not in busy and known[a].updated_at - _window_start(known[a].updated_at) >= 2]
    late = late[:late_changes]

    upserts: dict[str, dict[str, Any]] = {}
    for a in opens:
        upserts[a] = {"account": a, "region": rng.choice(REGIONS), "status": OPEN, "updated_at": when()}
    for a in moves:
        region = rng.choice([r for r in REGIONS if r != known[a].region])
        upserts[a] = {"account": a, "region": region, "status": OPEN, "updated_at": when()}
    for a in closes:
        upserts[a] = {"account": a, "region": known[a].region, "status": CLOSED, "updated_at": when()}
    for a in removes:  # the removal's time, on the row the DELETE then removes
        upserts[a] = {"account": a, "region": known[a].region, "status": known[a].status, "updated_at": when()}
    lates = {}
    for a in late:
        newest = known[a].updated_at
        older = _window_start(newest) + rng.randrange(newest - _window_start(newest))
        region = rng.choice([r for r in REGIONS if r != known[a].region])
        lates[a] = {"account": a, "region": region, "status": OPEN, "updated_at": older}

    step = 0
    updates = {**{a: upserts[a] for a in upserts if a not in opens}, **lates}
    inserts = {a: upserts[a] for a in opens}
    batches = [{**inserts, **updates}]
    if inserts and updates and rng.random() < 0.5:
        batches = [inserts, updates]
    for batch in batches:
        if not batch:
            continue
        table = pa.Table.from_pylist(list(batch.values()), schema=arrow_schema(ACCOUNTS_SCHEMA))
        if not delta_log.is_delta_table(path):
            DeltaTable.create(str(path), schema=arrow_schema(ACCOUNTS_SCHEMA),
                              configuration={"delta.enableChangeDataFeed": "true"},
                              commit_properties=_commit(round_, step))
            step += 1
        (DeltaTable(str(path))
         .merge(table, "t.account = s.account", source_alias="s", target_alias="t",
                commit_properties=_commit(round_, step))
         .when_matched_update_all().when_not_matched_insert_all().execute())
        for a, row in batch.items():
            if a in lates:
                known[a].landed = (round_, step)
            else:
                known[a] = _Account(row["region"], row["status"], row["updated_at"], landed=(round_, step))
        step += 1
    if removes:
        names = ", ".join(f"'{a}'" for a in sorted(removes))
        DeltaTable(str(path)).delete(f"account IN ({names})", commit_properties=_commit(round_, step))
        for a in removes:
            known[a].deleted, known[a].landed = True, (round_, step)
        step += 1
    return step


def _window_start(micros: int) -> int:
    return EPOCH_US + (micros - EPOCH_US) // ROUND_US * ROUND_US


def _land_payments(path: Any, round_: int, step: int, share: int, known: dict[str, _Account],
                   strangers: list[str], history: list[tuple[tuple[int, int], dict[str, Any]]],
                   rng: random.Random, *, bad_fraction: float, duplicate_fraction: float, commits: int) -> None:
    """Land round ``round_``'s ``share`` payment rows in ``commits`` appends from step ``step``."""
    import pyarrow as pa
    from deltalake import write_deltalake

    if share < 1:
        return
    start = EPOCH_US + round_ * ROUND_US + ROUND_US // 2
    open_ = sorted(a for a, s in known.items() if not s.deleted and s.status == OPEN)
    closed = sorted(a for a, s in known.items() if not s.deleted and s.status == CLOSED)
    removed = sorted(a for a, s in known.items() if s.deleted)
    earlier = [(at, row) for at, row in history if known.get(row["account"], _Account("", "", 0)).landed < at]
    duplicates = round(duplicate_fraction * share) if (commits > 1 or earlier) and share > 1 else 0
    fresh = share - duplicates

    def account() -> str:
        u = rng.random()
        for pool, below in ((strangers, 0.04), (closed, 0.09), (removed, 0.13)):
            if u < below and pool:
                return rng.choice(pool)
        return rng.choice(open_) if open_ else rng.choice(strangers)

    made = []
    for j in range(fresh):
        row = {"event_id": f"e{round_}-{j}", "account": account(), "amount_cents": rng.randint(-50_000, 50_000),
               "ts": start + rng.randrange(ROUND_US // 2)}
        if rng.random() < bad_fraction:
            spoil = rng.choice(("account", "account", "account", "blank", "amount_cents", "event_id"))
            row["account" if spoil == "blank" else spoil] = "  " if spoil == "blank" else None
        made.append(row)
    cuts = [round(c * fresh / commits) for c in range(commits + 1)]
    batches = [made[cuts[c]:cuts[c + 1]] for c in range(commits)]
    well_formed = lambda row: all(row[c] is not None for c in PAYMENTS_SCHEMA) and row["account"].strip()  # noqa: E731
    same = [(step + c, row) for c in range(commits - 1) for row in batches[c] if well_formed(row)]
    for _ in range(duplicates):
        pool = same if same and (not earlier or rng.random() < 0.5) else earlier
        if pool:
            batches[-1].append(dict(rng.choice(pool)[1]))
    rng.shuffle(batches[-1])
    for c, batch in enumerate(batches):
        if not batch:
            continue
        write_deltalake(str(path), pa.Table.from_pylist(batch, schema=arrow_schema(PAYMENTS_SCHEMA)), mode="append",
                        commit_properties=_commit(round_, step + c))
        history.extend(((round_, step + c), row) for row in batch if well_formed(row))
