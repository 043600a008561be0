"""spark-submit entry point: run one stage of a pipeline until caught up.

    spark-submit --master spark://host:7077 jobs/run_stage.py payments --warehouse W --stage source

A thin wrapper around ``ckpt run`` (same arguments, same exit codes); the Airflow hook builds
this argv (``checkpoint_lib.submit.build_submit_argv``), and so does ``bench/cluster.py``.
"""

import sys

from checkpoint_lib.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
