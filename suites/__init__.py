"""Ordeal's product suites: ``pytest suites/ -m smoke`` in a checkout, or
``pytest --pyargs suites -m smoke`` (``ordeal smoke``) wherever Ordeal is
installed. A package so that it ships in the wheel with its data
(known_findings/)."""
