"""An independent check of the reference pipelines' outputs (``payments``, ``transfers``,
``orders``): pandas and pyarrow, no Spark.

The expected ledger is computed from the landing table's files in source-offset order (table
version, file, row) straight from the Delta log; the gold tables are read with delta-rs. Sharing
no code path with the pipeline, it cannot share its bugs. For test- and demo-sized data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pyarrow.parquet as pq

from .delta import log as delta_log
from .files import files_at
from .layout import location, warehouse_location


def _root(warehouse: str | Path) -> Path | str:
    """The warehouse as a location to join with ``/`` (a local path or an object-store URI)."""
    return location(warehouse_location(warehouse))


@dataclass
class PaymentsCheck:
    valid_rows: int
    bad_rows: int
    ledger_rows: int
    dlq_rows: int
    problems: list[str] = field(default_factory=list)
    repeats: int = 0  # ledger rows beyond the first of their event (at-least-once only)
    at_least_once: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (
            f"{self.valid_rows} valid + {self.bad_rows} bad source rows; ledger {self.ledger_rows} rows, "
            f"dead letters {self.dlq_rows}"
        )
        verdict = (f": at least once, nothing lost, {self.repeats} repeated effects" if self.at_least_once
                   else ": exactly once, nothing lost")
        return head + (verdict if self.ok else "\n  - " + "\n  - ".join(self.problems))


def rows_in_offset_order(path: str | Path, upto: int | None = None) -> pd.DataFrame:
    """Every row a Delta table's log added up to version ``upto`` (default latest), with its offset
    (``src_version``, ``src_file``, ``src_row``), read with pyarrow (no Spark)."""
    path = location(path)
    latest = delta_log.latest_version(path) if upto is None else upto
    frames = []
    for f in delta_log.added_files(path, -1, latest if latest is not None else -1):
        with files_at(path).open(path / unquote(f.path)) as fh:
            table = pq.read_table(fh).to_pandas()
        table["src_version"], table["src_file"], table["src_row"] = f.version, f.path, range(len(table))
        frames.append(table)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def landing_in_offset_order(warehouse: str, upto: int | None = None) -> pd.DataFrame:
    rows = rows_in_offset_order(_root(warehouse) / "landing" / "payments", upto)
    if rows.empty:
        return pd.DataFrame(columns=["event_id", "account", "amount_cents", "ts", "src_version", "src_file", "src_row"])
    return rows


def read_delta(path: str | Path) -> pd.DataFrame:
    """A Delta table as pandas, with delta-rs (deletion vectors honoured: read through its SQL engine,
    since its pyarrow reader refuses them)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(str(path))
    if "deletionVectors" in (dt.protocol().reader_features or []):
        return pa.table(QueryBuilder().register("t", dt).execute("select * from t")).to_pandas()
    return dt.to_pandas()


def expected_payments(landing: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(ledger, balances, bad rows) that exactly-once processing of ``landing`` must produce."""
    bad_mask = landing["event_id"].isna() | landing["account"].isna() | (landing["account"].astype(str).str.strip() == "") | landing["amount_cents"].isna()
    bad = landing[bad_mask]
    good = landing[~bad_mask].sort_values(["src_version", "src_file", "src_row"], kind="stable").copy()
    good["amount_cents"] = good["amount_cents"].astype("int64")
    good["balance_after_cents"] = good.groupby("account")["amount_cents"].cumsum()
    ledger = good[["event_id", "account", "amount_cents", "balance_after_cents"]].reset_index(drop=True)
    balances = (
        good.groupby("account")
        .agg(balance_cents=("amount_cents", "sum"), event_count=("amount_cents", "size"))
        .reset_index()
    )
    return ledger, balances, bad


def check_payments(warehouse: str, *, exact_order: bool = True, at_least_once: bool = False) -> PaymentsCheck:
    """Compare the gold tables and the DLQ with the expected result. ``exact_order`` also checks
    every ledger row's ``balance_after_cents`` (the source-offset order of aligned runs).
    ``at_least_once``: repeated effects are allowed and counted (``repeats``), only missing or
    foreign ones are problems; balances then may hold repeated amounts and are not compared."""
    w = _root(warehouse)
    landing = landing_in_offset_order(warehouse)
    want_ledger, want_balances, bad = expected_payments(landing)
    ledger = read_delta(w / "gold" / "ledger")
    balances = read_delta(w / "gold" / "balances")
    dlq = read_delta(w / "dlq" / "payments")
    check = PaymentsCheck(len(want_ledger), len(bad), len(ledger), len(dlq), at_least_once=at_least_once)
    dup = int(ledger["event_id"].duplicated().sum())
    if at_least_once:
        check.repeats, dup, exact_order = dup, 0, False
    if dup:
        check.problems.append(f"{dup} ledger rows are duplicates")
    missing = set(want_ledger["event_id"]) - set(ledger["event_id"])
    extra = set(ledger["event_id"]) - set(want_ledger["event_id"])
    if missing:
        check.problems.append(f"{len(missing)} valid events missing from the ledger, e.g. {sorted(missing)[:3]}")
    if extra:
        check.problems.append(f"{len(extra)} ledger rows are not valid source events, e.g. {sorted(extra)[:3]}")
    if exact_order and not dup and not missing and not extra:
        merged = want_ledger.merge(ledger, on="event_id", suffixes=("", "_got"))
        wrong = merged[merged["balance_after_cents"] != merged["balance_after_cents_got"]]
        if len(wrong):
            check.problems.append(f"{len(wrong)} ledger rows have a wrong balance_after_cents")
    got = balances.set_index("account").sort_index()
    want = want_balances.set_index("account").sort_index()
    if at_least_once:
        if not set(want.index) <= set(got.index):
            check.problems.append(f"balances lack {len(set(want.index) - set(got.index))} accounts")
        elif (got.loc[want.index, "event_count"].astype("int64") < want["event_count"]).any():
            check.problems.append("some accounts counted fewer events than the source holds")
    elif len(got) != len(want) or not got.index.equals(want.index):
        check.problems.append(f"balances has {len(got)} accounts, expected {len(want)}")
    else:
        diff = (got[["balance_cents", "event_count"]].astype("int64") != want[["balance_cents", "event_count"]]).any(axis=1)
        if diff.any():
            check.problems.append(f"{int(diff.sum())} accounts have a wrong balance or count")
    dlq_keys = set(zip(dlq["src_file"].map(lambda p: Path(unquote(str(p))).name), dlq["src_row"]))
    bad_keys = set(zip(bad["src_file"].map(lambda p: Path(unquote(p)).name), bad["src_row"]))
    if dlq_keys != bad_keys or len(dlq) != len(bad):
        check.problems.append(f"dead letters hold {len(dlq)} rows, expected the {len(bad)} bad source rows")
    return check


@dataclass
class TransfersCheck:
    accounts: int
    valid_transfers: int
    bad_transfers: int
    dlq_rows: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (f"{self.accounts} accounts, {self.valid_transfers} valid + {self.bad_transfers} bad transfers, "
                f"dead letters {self.dlq_rows}")
        return head + (": balances exact, money conserved" if self.ok else "\n  - " + "\n  - ".join(self.problems))


def expected_transfers(warehouse: str, upto: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(balances per account, bad transfers) for the transfers up to table version ``upto``."""
    w = _root(warehouse)
    accounts = rows_in_offset_order(w / "landing" / "accounts")
    transfers = rows_in_offset_order(w / "landing" / "transfers", upto)
    bad_mask = (
        transfers["transfer_id"].isna() | transfers["src"].isna() | (transfers["src"].astype(str).str.strip() == "")
        | transfers["dst"].isna() | (transfers["dst"].astype(str).str.strip() == "")
        | transfers["amount_cents"].isna() | (transfers["amount_cents"].fillna(0) <= 0)
    )
    good = transfers[~bad_mask]
    balance = accounts.groupby("account")["opening_cents"].sum().astype("int64")
    out = good.groupby("src")["amount_cents"].sum().astype("int64")
    into = good.groupby("dst")["amount_cents"].sum().astype("int64")
    every = balance.index.union(out.index).union(into.index)
    total = (balance.reindex(every, fill_value=0) - out.reindex(every, fill_value=0)
             + into.reindex(every, fill_value=0))
    return total.rename("balance_cents").rename_axis("account").reset_index(), transfers[bad_mask]


def check_transfers(warehouse: str) -> TransfersCheck:
    """Compare ``gold/account_balances`` and the DLQ with the expected result."""
    w = _root(warehouse)
    want, bad = expected_transfers(warehouse)
    got = read_delta(w / "gold" / "account_balances")
    dlq = read_delta(w / "dlq" / "transfers")
    transfers = rows_in_offset_order(w / "landing" / "transfers")
    check = TransfersCheck(len(want), len(transfers) - len(bad), len(bad), len(dlq))
    if got["account"].duplicated().any():
        check.problems.append("account_balances holds an account twice")
    g = got.set_index("account")["balance_cents"].astype("int64").sort_index()
    e = want.set_index("account")["balance_cents"].sort_index()
    if not g.index.equals(e.index):
        check.problems.append(f"account_balances has {len(g)} accounts, expected {len(e)}")
    elif (g != e).any():
        check.problems.append(f"{int((g != e).sum())} accounts have a wrong balance")
    if int(g.sum()) != int(e.sum()):
        check.problems.append(f"money not conserved: {int(g.sum())} != {int(e.sum())}")
    if len(dlq) != len(bad):
        check.problems.append(f"dead letters hold {len(dlq)} rows, expected the {len(bad)} bad transfers")
    return check


@dataclass
class OrdersCheck:
    distinct_orders: int
    repeats: int
    bad_rows: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = f"{self.distinct_orders} distinct orders, {self.repeats} repeats, {self.bad_rows} bad rows"
        return head + (": each order once, customers exact" if self.ok else "\n  - " + "\n  - ".join(self.problems))


def expected_orders(warehouse: str) -> dict[str, pd.DataFrame]:
    """What exactly-once processing of ``landing/orders`` must produce: ``orders`` (the first row of
    each valid id, in offset order), ``repeats`` (the others), ``customers`` and ``bad`` rows. Exact
    when every repeat comes within the retention window of its order (the generator's do)."""
    landing = rows_in_offset_order(_root(warehouse) / "landing" / "orders")
    bad = (landing["order_id"].isna() | landing["customer"].isna() | (landing["customer"].astype(str).str.strip() == "")
           | landing["amount_cents"].isna() | (landing["amount_cents"].fillna(0) <= 0) | landing["ts"].isna())
    good = landing[~bad].sort_values(["src_version", "src_file", "src_row"], kind="stable")
    first = ~good.duplicated("order_id")
    fresh = good[first]
    last = fresh.sort_values("ts", kind="stable").groupby("customer").tail(1).set_index("customer")
    customers = fresh.groupby("customer").agg(orders=("order_id", "size"), max_amount_cents=("amount_cents", "max"))
    customers["last_order_id"] = last["order_id"]
    customers["last_order_ts"] = pd.to_datetime(last["ts"], utc=True)
    return {"orders": fresh, "repeats": good[~first], "customers": customers.sort_index(), "bad": landing[bad]}


def check_orders(warehouse: str) -> OrdersCheck:
    """Compare ``gold/orders``, ``gold/order_duplicates``, ``gold/customers`` and the DLQ with the
    expected result. A repeat and its order carry the same values, so which copy a lagging channel
    let through first does not change the tables compared (the duplicates are compared by id)."""
    w = _root(warehouse)
    want = expected_orders(warehouse)
    check = OrdersCheck(len(want["orders"]), len(want["repeats"]), len(want["bad"]))
    orders = read_delta(w / "gold" / "orders")
    if orders["order_id"].duplicated().any():
        check.problems.append(f"{int(orders['order_id'].duplicated().sum())} orders are in gold/orders twice")
    missing = set(want["orders"]["order_id"]) - set(orders["order_id"])
    extra = set(orders["order_id"]) - set(want["orders"]["order_id"])
    if missing or extra:
        check.problems.append(f"gold/orders lacks {len(missing)} orders and has {len(extra)} foreign ones, "
                              f"e.g. {sorted(missing | extra)[:3]}")
    dups = read_delta(w / "gold" / "order_duplicates")
    if sorted(dups["order_id"]) != sorted(want["repeats"]["order_id"]):
        check.problems.append(f"gold/order_duplicates holds {len(dups)} repeats, expected {len(want['repeats'])}")
    got = read_delta(w / "gold" / "customers").set_index("customer").sort_index()
    exp = want["customers"]
    if not got.index.equals(exp.index):
        check.problems.append(f"gold/customers has {len(got)} customers, expected {len(exp)}")
    else:
        wrong = ((got["orders"].astype("int64") != exp["orders"].astype("int64"))
                 | (got["max_amount_cents"].astype("int64") != exp["max_amount_cents"].astype("int64"))
                 | (got["last_order_id"] != exp["last_order_id"])
                 | (pd.to_datetime(got["last_order_ts"], utc=True) != exp["last_order_ts"]))
        if wrong.any():
            check.problems.append(f"{int(wrong.sum())} customers have a wrong count, max or last order")
    dlq = read_delta(w / "dlq" / "orders")
    if len(dlq) != len(want["bad"]):
        check.problems.append(f"dead letters hold {len(dlq)} rows, expected the {len(want['bad'])} bad rows")
    return check
