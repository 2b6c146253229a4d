"""The history: one record per event, in the order the harness saw them.

Modelled on Jepsen's history. Every request is an ``invoke`` op followed by
exactly one completion: ``ok`` (it ran), ``fail`` (it certainly did not, or
the server said so) or ``info`` (unknown: a timeout or a lost connection; the
request may have run). Faults are recorded in the same history under the
process ``"nemesis"`` so that every checker sees the fault windows.

The file (format 2) is JSON Lines, so ``grep`` and ``jq`` still work, and is
an append-only store of verified chunks, fit for runs of days::

    {"chunk":-1,"ordeal_history":2,"chunk_max_ops":4096,"chunk_max_bytes":4194304,...}
    {"index":0,"time_ns":...,"wall":"...","type":"invoke","process":3,"f":"completions",...}
    ... one op per line ...
    {"chunk":0,"first":0,"ops":153,"bytes":40211,"crc32c":"1a2b3c4d"}
    {"index":153,...}
    ...
    {"chunk":1,"first":153,"ops":97,"bytes":25510,"crc32c":"0e4f5a6b"}

Line 1 is the header (it has the key ``ordeal_history``). A line with the
key ``chunk`` and no ``index`` is a store record, never an op: the header
(chunk -1) or a chunk's trailer. A trailer seals the op lines since the
previous one: their count, the index of the first, their bytes and their
CRC-32C (Castagnoli, as 8 hex digits). Chunks are numbered 0, 1, 2, ...

A file without the header is the plain JSON Lines written before format 2:
it is read line by line as it always was, without verification.

The modules, one home each (nothing is re-exported here):

- ``ops``: the vocabulary: ``Op``, the op types, the harness's process
  names (``NEMESIS``, ``MONITOR``, ``HARNESS``), the wall-clock format.
- ``writer``: ``History`` (append, chunk sealing, fsync, ``resume`` and
  ``record_gap``), ``HistoryWriteError``, ``GAP_ERROR``.
- ``reader``: ``read_history`` (the whole file, each chunk verified) and
  ``HistoryTail`` (a growing file, chunk by chunk as they are sealed, with
  the same verification), ``HistoryError``.
- ``windows``: fault windows from the nemesis ops (``FaultWindows``, fed op
  by op, and ``fault_windows`` over a whole history): what every consumer
  that splits a run by fault uses.
"""
