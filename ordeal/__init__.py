"""Ordeal's shared vocabulary and the contracts every layer keeps: the
history (ops, writer, reader, fault windows), topology protocols,
configuration, the served journal, process ownership.

This package imports none of the others; they all import it (the layers:
docs/DEVELOPING.md, checked by tests/test_layers.py). Its adapters are the
thinnest there are (/proc, cgroupfs, the process records) and touch nothing
the suite did not start.
"""

__version__ = "0.1.0"
