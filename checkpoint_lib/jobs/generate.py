"""spark-submit entry point: append generated input to a pipeline's landing table (demo data).

    spark-submit --master spark://host:7077 jobs/generate.py payments --warehouse W --rows 1000

A thin wrapper around ``ckpt generate``.
"""

import sys

from checkpoint_lib.cli import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
