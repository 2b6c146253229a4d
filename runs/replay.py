"""The command that runs one test again with the options it ran with
(summary.json ``replay``, the report's replay line), secrets redacted."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from ordeal.config import (
    redact_argv,
)


def replay_line(nodeid: str, args: Iterable[str]) -> str:
    """The command that runs test ``nodeid`` again with the options it ran
    with: its node id, then the invocation's ``args`` less its test
    selection (paths, node ids, -k and -m). Secret-looking values are
    redacted (``redact_argv``): a secret-looking flag's value, an
    ``--engine-env`` pair's whose name looks secret, and the same inside
    ``--engine-args``/``--router-args``."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-k", "-m"):
            skip = True
            continue
        if (arg.startswith(("-k", "-m")) and not arg.startswith("--")) or (
                not arg.startswith("-") and ("::" in arg or arg.endswith(".py")
                                             or arg.rstrip("/") in ("suites", "tests")
                                             or arg.startswith(("suites/", "tests/")))):
            continue
        kept.append(arg)
    # redact_argv also hides a secret-looking --engine-env pair's value, and
    # what is secret inside --engine-args / --router-args.
    return shlex.join(["python", "-m", "pytest", nodeid, *redact_argv(kept)])
