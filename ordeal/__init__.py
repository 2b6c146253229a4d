"""Ordeal's shared vocabulary: history ops, topology protocols, configuration.

This package imports none of the others (fixtures, faults, invariants,
reports); they all import it. Keep it free of anything that touches a process
or a socket.
"""

__version__ = "0.1.0"
