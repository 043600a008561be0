# PYTHON_ARGCOMPLETE_OK
"""``python -m checkpoint_lib.cli``: the ``ckpt`` command as a process of its own (how
``demo.py``, ``submit.py``'s ``ckpt run`` child, the crash tests and ``bench/`` start it)."""

import sys

from checkpoint_lib.cli import main

if __name__ == "__main__":
    sys.exit(main())
