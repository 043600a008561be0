"""spark-submit entry point: apply the retention rules of a pipeline (``ckpt maintain``).

    spark-submit --master spark://host:7077 jobs/maintain.py payments --warehouse W [--dry-run]

A thin wrapper around ``ckpt maintain`` (same arguments, same exit codes).
"""

import sys

from checkpoint_lib.cli import main

if __name__ == "__main__":
    sys.exit(main(["maintain", *sys.argv[1:]]))
