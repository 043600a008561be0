"""spark-submit entry point: recover a pipeline (new epoch, restore, re-commit/abort, replay).

    spark-submit --master spark://host:7077 jobs/recover.py payments --warehouse W [--checkpoint 7]

A thin wrapper around ``ckpt recover`` (same arguments, same exit codes).
"""

import sys

from checkpoint_lib.cli import main

if __name__ == "__main__":
    sys.exit(main(["recover", *sys.argv[1:]]))
