"""``transfers``: the cyclic reference pipeline (names and schemas are fixed by the issue).

- ``landing/accounts``: ``account string, opening_cents long``, the opening balances, read once
  (a :class:`~checkpoint_lib.pipeline.Bootstrap`) when the pipeline starts from scratch;
- ``landing/transfers``: ``transfer_id string, src string, dst string, amount_cents long``,
  appended over time; bad rows (null ids or accounts, a non-positive or null amount) are
  dead-lettered;
- the keyed ``bank`` operator (parallelism 3): a transfer goes to the owner of ``src``, which
  debits ``src`` and sends a credit to the owner of ``dst`` over a **feedback edge into the same
  operator** (a cycle); balances may go negative;
- ``gold/account_balances``: ``account, balance_cents``, upserted by two-phase commit.

Money only moves, so every consistent snapshot satisfies: the balances in the operator state plus
the credits in its channel state equal the opening balances (the openings enter as credits).
Aligned and at-least-once checkpoints cannot handle the cycle and are refused.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from ..pipeline import FEEDBACK, Bootstrap, DeltaSink, DeltaSource, Pipeline
from ..quality.spec import QualitySpec, sum_of
from .payments import account_digits

ACCOUNTS_SCHEMA = {"account": "string", "opening_cents": "long"}
TRANSFERS_SCHEMA = {"transfer_id": "string", "src": "string", "dst": "string", "amount_cents": "long"}
RECORD_SCHEMA = {"account": "string", "counterparty": "string", "transfer_id": "string",
                 "amount_cents": "long", "movement": "string"}
BALANCES_SCHEMA = (("account", "string"), ("balance_cents", "long"))
OFFSETS = ("src_version", "src_file", "src_row")
DEBIT, CREDIT = "debit", "credit"


def transfer_errors(df: Any) -> Any:
    """The reason a landing transfer is bad, or null."""
    from pyspark.sql import functions as F

    return (
        F.when(F.col("transfer_id").isNull(), F.lit("null transfer_id"))
        .when(F.col("src").isNull() | (F.trim(F.col("src")) == ""), F.lit("null or empty src"))
        .when(F.col("dst").isNull() | (F.trim(F.col("dst")) == ""), F.lit("null or empty dst"))
        .when(F.col("amount_cents").isNull(), F.lit("null amount_cents"))
        .when(F.col("amount_cents") <= 0, F.lit("amount_cents must be positive"))
    )


def _debits(df: Any) -> Any:
    """A valid transfer becomes a debit of ``src``, routed to the owner of ``src``."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("src").alias("account"), F.col("dst").alias("counterparty"), "transfer_id", "amount_cents",
        F.lit(DEBIT).alias("movement"), "sender", *OFFSETS,
    )


def _openings(df: Any) -> Any:
    """An opening balance enters as a credit of the account (from nobody)."""
    from pyspark.sql import functions as F

    return df.select(
        "account", F.lit(None).cast("string").alias("counterparty"),
        F.concat(F.lit("open:"), F.col("account")).alias("transfer_id"),
        F.col("opening_cents").alias("amount_cents"), F.lit(CREDIT).alias("movement"), "sender", *OFFSETS,
    )


class Bank:
    """Keeps ``balance_cents`` per account. A debit lowers it and sends a credit to ``dst``'s
    owner over the feedback edge; a credit raises it. Emits the new balance of every touched account."""

    state_schema = "balance_cents long"
    order_by = OFFSETS

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]:
        from pyspark.sql import functions as F

        signed = F.when(F.col("movement") == DEBIT, -F.col("amount_cents")).otherwise(F.col("amount_cents"))
        per_key = records.groupBy(key).agg(F.sum(signed).alias("balance_cents"))
        prior = state.select(F.col(key), F.col("balance_cents").alias("prior_balance"))
        balances = per_key.join(prior, key, "left").select(
            key, (F.coalesce("prior_balance", F.lit(0)) + F.col("balance_cents")).alias("balance_cents"),
        )
        credits = records.where(F.col("movement") == DEBIT).select(
            F.col("counterparty").alias("account"), F.col(key).alias("counterparty"), "transfer_id",
            "amount_cents", F.lit(CREDIT).alias("movement"), "sink_subtask", *OFFSETS,
        )
        deltas = per_key.select(key, "balance_cents")
        return deltas, {"account_balances": balances, FEEDBACK: credits}


def quality_spec() -> QualitySpec:
    """Balances only move: a valid transfer debits ``src`` and credits ``dst``; the openings (the
    bootstrap table) are credits. In flight, a debit not yet applied moves nothing until it is
    (``full``: both sides), a credit adds to its account."""

    def source_records(ctx: Any, records: Any) -> Any:
        """``records``: the transfers as the operator gets them, debit movements (the map's output)."""
        from pyspark.sql import functions as F

        openings = ctx.spark.read.format("delta").load(ctx.path("landing/accounts")).select(
            "account", F.col("opening_cents").alias("amount_cents"))
        debits = records.select("account", (-F.col("amount_cents")).alias("amount_cents"))
        credits = records.select(F.col("counterparty").alias("account"), "amount_cents")
        return openings.unionByName(debits).unionByName(credits)

    def channel_records(channel: Any, full: bool) -> Any:
        from pyspark.sql import functions as F

        debit = F.col("movement") == "debit"
        applied = channel.select("account", F.when(debit, -F.col("amount_cents"))
                                 .otherwise(F.col("amount_cents")).alias("amount_cents"))
        if not full:
            return applied
        onward = channel.where(debit).select(F.col("counterparty").alias("account"), "amount_cents")
        return applied.unionByName(onward)

    return QualitySpec(
        pipeline="transfers",
        event_sink=None,
        event_id=None,
        key_sink="account_balances",
        aggregates={"balance_cents": sum_of("amount_cents")},
        source_records=source_records,
        channel_records=channel_records,
    )


def build() -> Pipeline:
    return (
        Pipeline("transfers")
        .source(DeltaSource("landing/transfers", TRANSFERS_SCHEMA, validate=transfer_errors), parallelism=2)
        .bootstrap(Bootstrap("landing/accounts", ACCOUNTS_SCHEMA, _openings))
        .map(_debits, schema=RECORD_SCHEMA)
        .key_by("account", parallelism=3)
        .process(Bank(), uid="bank")
        .iterate()
        .sink("account_balances", DeltaSink("gold/account_balances", BALANCES_SCHEMA, mode="upsert",
                                            keys=("account",)))
        .dead_letters("dlq/transfers")
        .validated_per_checkpoint()
        .generator(generate)
        .quality(quality_spec())
    )


def generate(
    spark: Any,
    warehouse: str,
    rows: int,
    *,
    accounts: int = 100,
    bad_fraction: float = 0.0,
    skew: float = 0.0,
    seed: int | None = None,
    files: int = 2,
) -> int:
    """Append ``rows`` transfers to ``warehouse/landing/transfers`` as one new table version,
    creating ``landing/accounts`` (``accounts`` accounts with opening balances) on first use.

    Generated in Spark. ``skew`` in 0..1 sends that fraction of the transfers from one hot
    account (its owner subtask becomes the slow one). About ``bad_fraction`` of the rows are bad
    (null ``src`` or a non-positive amount). Returns the new table version."""
    from pyspark.sql import functions as F

    from ..delta.log import latest_version

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if accounts < 2:
        raise ValueError(f"accounts must be >= 2, got {accounts}")
    for name, value in (("bad_fraction", bad_fraction), ("skew", skew)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be within 0..1, got {value}")
    root = warehouse.rstrip("/")
    seed = random.randrange(2**31) if seed is None else seed
    acct = F.concat(F.lit("acct-"), F.lpad(F.col("n").cast("string"), account_digits(accounts), "0"))
    if latest_version(f"{root}/landing/accounts") is None:
        (
            spark.range(accounts).withColumnRenamed("id", "n")
            .select(acct.alias("account"),
                    (F.pmod(F.xxhash64(F.col("n"), F.lit(seed)), F.lit(1_000_000)) + 1000).cast("long").alias("opening_cents"))
            .coalesce(1).write.format("delta").mode("append").save(f"{root}/landing/accounts")
        )
    previous = latest_version(f"{root}/landing/transfers")
    batch = 0 if previous is None else previous + 1
    pick = lambda salt: F.pmod(F.xxhash64(F.col("id"), F.lit(seed + salt)), F.lit(accounts))  # noqa: E731
    src = F.when(F.col("u") < skew, F.lit(0)).otherwise(pick(1))
    df = (
        spark.range(rows, numPartitions=max(1, files))
        .withColumn("u", F.rand(seed))
        .withColumn("n", src)
        .withColumn("src", acct)
        .withColumn("n", pick(2))
        .withColumn("dst", acct)
        .select(
            F.concat(F.lit(f"t{batch}-"), F.col("id").cast("string")).alias("transfer_id"),
            "src", "dst",
            (F.pmod(F.xxhash64(F.col("id"), F.lit(seed + 3)), F.lit(50_000)) + 1).cast("long").alias("amount_cents"),
            "u",
        )
    )
    if bad_fraction > 0:
        v = F.rand(seed + 4)
        df = df.withColumn("src", F.when(v < bad_fraction / 2, F.lit(None)).otherwise(F.col("src")))
        df = df.withColumn("amount_cents", F.when((v >= bad_fraction / 2) & (v < bad_fraction), F.lit(0))
                           .otherwise(F.col("amount_cents")))
    df.drop("u").write.format("delta").mode("append").save(f"{root}/landing/transfers")
    return latest_version(f"{root}/landing/transfers")
