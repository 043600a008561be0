"""The pure checkpoint core.

Everything in this package is engine-free: it imports nothing from Spark, Delta, Airflow or Great
Expectations and performs no I/O. State machines take events and return decisions or effects; the
adapters (``checkpoint_lib.spark``, ``plugins/``, ``expectations/``) carry the effects out.

Pieces:

- :mod:`.types` and :mod:`.errors`: the vocabulary (ids, barriers, closed enums, exceptions).
- :mod:`.clock`: injected time (``SystemClock`` in production, ``ManualClock`` in tests).
- :mod:`.decider`: the pure trigger policy (interval, min pause, max concurrent, all tasks running).
- :mod:`.checkpoints`: pending and completed checkpoints, acknowledgement classification.
- :mod:`.stores`: small storage interfaces (id counter, completed-checkpoint store) with in-memory
  implementations; the Delta ones live in the adapters and pass the same contract tests.
- :mod:`.coordinator`: the checkpoint coordinator state machine.
- :mod:`.barriers`: per-subtask barrier handlers (aligned, unaligned, aligned-with-timeout, tracker).
- :mod:`.twophase`: two-phase-commit sink bookkeeping, transaction-id pool and epoch fencing.
- :mod:`.acks`: what each kind of subtask acknowledges (source, keyed operator, sink), typed, with
  the one encoding of each as the dict a checkpoint stores; the positions a restore derives.
- :mod:`.recovery`: recovery planning from the completed checkpoints.
- :mod:`.retention`: what the retained checkpoints need, and the protocol of a store whose old
  rows maintenance drops.
"""
