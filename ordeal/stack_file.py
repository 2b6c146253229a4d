"""The stack file: one checked-in file that holds the run options a team
sets for its stack (issue 43), so a qualification run is ``pytest suites/
-m smoke`` with nothing else to remember.

Where it is read from, the first that exists:

1. ``--stack FILE`` (it must exist);
2. ``ordeal.toml`` in the directory pytest runs from;
3. the ``[tool.ordeal]`` table of ``pyproject.toml`` there.

Its keys are the long option names without the leading dashes
(``load-duration`` or ``load_duration`` for ``--load-duration``), with TOML
values: a string or number for a value option, ``true``/``false`` for a
switch, an array for an option given many times (``engine-env``,
``allow-target``). An option given on the command line wins over the file.
What the file set, and its sha256, go into every run's summary.json
(``stack_file``); a secret stays a variable's name (``api_key_env`` in a
target file), and a secret-looking value is redacted there as in the replay
line. ``--stack none`` reads no file.

Pure apart from reading the file: ``apply`` gets the options' descriptions
and returns the values to set; the plugin sets them.
"""

from __future__ import annotations

import difflib
import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ConfigError

FILE_NAME = "ordeal.toml"


@dataclass(frozen=True)
class OptionInfo:
    """What the plugin declared for one option (fixtures/plugin.py)."""

    flag: str  # "--load-duration"
    dest: str  # "load_duration"
    kind: str  # "value", "switch" (store_true) or "many" (append)
    type: type = str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class StackFile:
    path: Path
    sha256: str
    values: dict[str, Any]
    table: str = ""  # "" for ordeal.toml, "tool.ordeal" for pyproject.toml


@dataclass
class Applied:
    """What a stack file set: option dest -> value, and the file's keys the
    command line overrode."""

    values: dict[str, Any] = field(default_factory=dict)
    overridden: list[str] = field(default_factory=list)


def find(explicit: str | None, cwd: Path) -> StackFile | None:
    """The stack file of this run, read and parsed; None when there is none
    (or ``--stack none``). A ConfigError says what is wrong with it."""
    if explicit is not None:
        if explicit.strip().lower() == "none":
            return None
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"--stack {explicit}: no such file (write one with "
                              f"python -m ordeal init, or give --stack none)")
        return _read(path, table="tool.ordeal" if path.name == "pyproject.toml" else "")
    own = cwd / FILE_NAME
    if own.is_file():
        return _read(own, "")
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return None  # not ours to judge: pytest reads it too and says what is wrong
        if isinstance(data.get("tool"), dict) and "ordeal" in data["tool"]:
            return _read(pyproject, "tool.ordeal")
    return None


def _read(path: Path, table: str) -> StackFile:
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"stack file {path}: not valid TOML: {e}") from None
    if table:
        for part in table.split("."):
            data = data.get(part) if isinstance(data, dict) else None
        if not isinstance(data, dict):
            raise ConfigError(f"stack file {path}: [{table}] must be a table of options")
    return StackFile(path, hashlib.sha256(raw).hexdigest(), dict(data), table)


def apply(stack: StackFile, options: dict[str, OptionInfo],
          given: set[str]) -> Applied:
    """The values the file sets: every key checked against ``options`` (by
    dest) and converted; ``given``: the dests the command line set, which
    win. Every mistake at once, in one ConfigError."""
    where = f"stack file {stack.path}" + (f" [{stack.table}]" if stack.table else "")
    out = Applied()
    problems: list[str] = []
    for key, value in stack.values.items():
        dest = str(key).replace("-", "_")
        info = options.get(dest)
        if info is None:
            close = difflib.get_close_matches(dest, list(options), n=1)
            hint = f" (did you mean {close[0].replace('_', '-')}?)" if close else ""
            problems.append(f"{key!r} is not an option{hint}")
            continue
        if dest == "stack":
            problems.append("'stack' cannot name another stack file")
            continue
        try:
            converted = _convert(info, value)
        except ValueError as e:
            problems.append(f"{key} = {value!r}: {e}")
            continue
        if dest in given:
            out.overridden.append(dest)
            continue
        out.values[dest] = converted
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems)
                          + " (keys are the long options without '--': pytest --help lists them)")
    return out


def _convert(info: OptionInfo, value: Any) -> Any:
    if info.kind == "switch":
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    if info.kind == "many":
        items = value if isinstance(value, list) else [value]
        return [_scalar(info, v) for v in items]
    if isinstance(value, (list, dict)):
        raise ValueError(f"{info.flag} takes one value")
    return _scalar(info, value)


def _scalar(info: OptionInfo, value: Any) -> Any:
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise ValueError(f"{info.flag} takes a {info.type.__name__}, not {value!r}")
    if info.type in (int, float):
        if not isinstance(value, (int, float)) or (info.type is int and value != int(value)):
            raise ValueError(f"must be a{'' if info.type is float else ' whole'} number")
        value = info.type(value)
    else:
        value = str(value)
    if info.choices and value not in info.choices:
        raise ValueError(f"use one of {', '.join(info.choices)}")
    return value


def as_argv(values: dict[str, Any], options: dict[str, OptionInfo]) -> list[str]:
    """The command-line form of what a file set (for summary.json, where it
    is redacted like the replay line)."""
    argv: list[str] = []
    for dest, value in values.items():
        info = options[dest]
        if info.kind == "switch":
            if value:
                argv.append(info.flag)
        elif info.kind == "many":
            for v in value:
                argv += [info.flag, str(v)]
        else:
            argv += [info.flag, str(value)]
    return argv
