"""An in-memory dataflow simulator built on the pure core (no engines, no I/O).

It runs a money-moving pipeline (sources -> keyed stages -> 2PC sink) with random interleavings,
crashes and recoveries, and keeps enough history to check Chandy-Lamport consistency, exactly-once
and token conservation. The property tests and the first demo use it.
"""

from .simulation import Aborts, Record, Simulation, SimulationResult, Topology

__all__ = ["Aborts", "Record", "Simulation", "SimulationResult", "Topology"]
