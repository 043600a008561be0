"""Benchmarks (see docs/benchmarks.md): ``python bench/compare.py`` or ``make bench``."""
