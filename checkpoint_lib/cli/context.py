"""What a ``ckpt`` command's arguments name, made real: the pipeline (a registered name or a
``module:attr`` reference: a linear pipeline, or either kind with :func:`declared`), the Spark
session (``--master``, ``--spark-conf``, ``--warehouse``), and an engine imported in the
background while the command waits for another.

Each imports its engine when called, so ``ckpt --help`` works with the core alone. The commands
call these through the module (``context.spark_session(args)``), so a test that replaces one
replaces it for every command."""

from __future__ import annotations

import argparse
import os
import sys


def spark_session(args: argparse.Namespace, short_lived: bool = False):
    """The command's Spark session (``short_lived``: see :data:`~checkpoint_lib.spark.session.SHORT_LIVED_JIT`)."""
    from ..spark.session import get_spark, use_warehouse

    spark = get_spark(master=getattr(args, "master", None), app_name="ckpt",
                      extra_conf=dict(getattr(args, "spark_conf", None) or ()), short_lived=short_lived)
    if getattr(args, "warehouse", None):
        use_warehouse(spark, args.warehouse)
    return spark


def import_in_background(module: str) -> None:
    """Import ``module`` on a daemon thread (its cost overlaps the caller's wait for Spark); the
    first real use waits on Python's import lock for it, and an import error shows there."""
    import importlib
    import threading

    if module in sys.modules:  # (recover asks before its run, and its validation again)
        return

    def load() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # shown where the module is used
            pass

    threading.Thread(target=load, name=f"import {module}", daemon=True).start()


def pipeline(name: str):
    """The linear pipeline ``name`` (a dataflow graph is refused, naming the commands that take one)."""
    from ..pipelines import get

    return get(name)


def declared(name: str):
    """What ``name`` declares: a linear pipeline or a dataflow graph (the commands that take both)."""
    from ..pipelines import declared as declared_

    return declared_(name)


def resolve_pipeline(args: argparse.Namespace) -> None:
    """``args.pipeline`` as a name: a ``module:attr`` reference is imported (from the current
    directory too, like ``python -m``) and known by its name to the rest of the process."""
    ref = getattr(args, "pipeline", None)
    if not isinstance(ref, str):
        return
    from ..pipelines import name_of

    importable_from_here(ref)
    args.pipeline = name_of(ref)


def importable_from_here(ref: str) -> None:
    """A ``module:attr`` reference's module is found in the current directory too (like
    ``python -m``)."""
    from ..pipelines import is_reference

    if is_reference(ref) and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
