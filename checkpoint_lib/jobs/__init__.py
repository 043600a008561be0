"""The ``spark-submit`` entry points: each file is a script (``spark-submit .../run_stage.py payments
--warehouse W --stage source``), thin over the CLI. They ship inside the package, so an installed
wheel can submit them (:data:`checkpoint_lib.submit.JOBS_DIR`); a checkout's top-level ``jobs/``
links here."""
