"""Spark engine for checkpoint_lib: Delta Lake jars on local disk and a shared SparkSession.

Nothing here imports pyspark at import time; ``checkpoint_lib.spark.session`` does so only
when a session is requested, so the pure core stays usable without the ``spark`` extra.
"""
