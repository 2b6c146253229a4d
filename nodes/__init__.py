"""One node as the harness runs it: a labelled process group (``process``),
the ``Node`` built on it (``local``), waits that explain themselves
(``waits``) and free loopback ports (``ports``). Engines and clusters build
on this; it knows no engine."""
