"""The file a pytest-xdist worker's ``__main__`` names (tests/conftest.py): empty, so a process that
multiprocessing's ``spawn`` starts from a worker runs it as its main script and nothing else."""
