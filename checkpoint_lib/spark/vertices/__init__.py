"""The vertex kinds of a running graph (:mod:`checkpoint_lib.spark.graph_runner`): a source
(:mod:`.source`), an operator, keyed, two-input keyed or stateless (:mod:`.operator`), and the
sinks attached to either (:mod:`.sinks`)."""
