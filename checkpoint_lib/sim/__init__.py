"""An in-memory dataflow simulator built on the pure core (no engines, no I/O).

It runs a money-moving pipeline on any dataflow graph (a DAG: sources -> keyed stages, with fan-in,
fan-out and diamonds -> one or more 2PC sinks; :mod:`.topology`) with random interleavings, crashes
and recoveries, and keeps enough history to check Chandy-Lamport consistency, exactly-once and
token conservation. The property tests and the first demo use it.
"""

from .simulation import Aborts, Record, Simulation, SimulationResult
from .topology import Graph, Topology

__all__ = ["Aborts", "Graph", "Record", "Simulation", "SimulationResult", "Topology"]
