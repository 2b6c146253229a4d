"""The docs stay true to the code (issue 43).

README.md is the five-minute start (under 200 lines, with a table of
contents); the reference is in docs/*.md, one page per topic, each linked
from the README. These tests read the README and those pages (not
docs/DEVELOPING.md, the developers' log, which quotes old commands on
purpose, nor docs/examples/, the records of runs) and check, with no cluster
and no subprocess:

1. the README's length and table of contents, and that every relative link
   of every page reaches a file, and its ``#anchor`` a heading (GitHub's
   slugs); every page is linked from the README;
2. every ``--option`` a command line in the docs gives to pytest, ``ordeal``,
   ``python -m reports|faults|faults.proxy|bench|runs.gpu_scenario`` is an
   option of that command (of that subcommand, for the ones that have
   them), and every other ``--option`` the pages write anywhere (prose, code
   spans, shell blocks) is one of those options or one of another tool's,
   listed in ``OTHER_TOOLS`` with why;
3. every option the plugin adds has its row in docs/options.md, and every
   row of an options table is an option of the plugin;
4. every ``ordeal SUBCOMMAND`` (and ``python -m reports|faults SUB``) the
   docs show exists, and every subcommand of ``ordeal`` is shown;
5. every ```toml block says on its first line what file it is
   (``# ordeal.toml``, ``# pyproject.toml``, ``# target.toml`` or a line
   naming "the target file", ``# slo.toml``, ``# thresholds.toml``,
   ``# known-findings.toml``) and is read by the code that reads that file:
   a stack file's keys (commented ones too) are the plugin's options.

Where the options come from: the plugin's by calling its
``pytest_addoption`` with a parser that only records (every group, so an
option added outside ``OPTIONS`` counts too); pytest's and the installed
plugins' from this session's own parser, which holds exactly what ``pytest
--help`` prints (``config._parser``, private but stable since pytest 3; a
subprocess of ``pytest --help`` would cost seconds of a 2-core machine); the
argparse commands' by running their ``main`` with ``parse_args`` replaced by
a catch of the parser built, so subcommands and their options are the real
ones. Each check is a function of the text, and ``test_the_checks_catch``
plants one mistake of each kind to show the checks fail.
"""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
#: docs/*.md pages not checked: the developers' log keeps history as it was.
NOT_CHECKED = {"DEVELOPING.md"}
MAX_README_LINES = 200

#: Options of tools that are not Ordeal's, which the pages quote (in prose,
#: code spans and shell lines), each with the tool it belongs to. Anything
#: not here and not an option of one of Ordeal's commands is a mistake.
OTHER_TOOLS = {
    # vLLM's server (--engine-args passes them through; Ordeal sets some itself)
    "--max-num-seqs": "vllm", "--dtype": "vllm", "--gpu-memory-utilization": "vllm",
    "--enable-prefix-caching": "vllm", "--host": "vllm", "--port": "vllm",
    "--middleware": "vllm", "--api-key": "vllm", "--tensor-parallel-size": "vllm",
    "--goodput": "vllm bench serve",
    # vllm-router's flags (--router-args passes them through)
    "--policy": "vllm-router", "--max-payload-size": "vllm-router",
    # systemd-run, the 72-hour run as a transient service (docs/endurance.md)
    "--unit": "systemd-run", "--working-directory": "systemd-run",
    # pip, in the install lines
    "--no-deps": "pip", "--find-links": "pip",
    "--disable-pip-version-check": "pip",
    # Docker's hardening flags the containers run with, and kubectl's
    # (tritonserver's --trace-config and kubectl's --timeout are pytest's options too, so
    # known anyway: a name already known cannot be listed here)
    "--cap-drop": "docker run", "--wait": "kubectl delete",
    # iptables' statistic match (packet_loss's rules)
    "--mode": "iptables -m statistic",
    # Ray's ray start / node flags (docs/ray.md explains why they are not used)
    "--node-ip-address": "ray start", "--head": "ray start", "--include-dashboard": "ray start",
    # ray_node_main's own flag (a process the harness starts, not a user command)
    "--cgroup": "python -m clusters.ray_node_main",
}


# ------------------------------------------------------------------ pages


def pages() -> dict[str, str]:
    """The checked pages by their path from the repository root."""
    out = {"README.md": README.read_text()}
    for p in sorted(DOCS.glob("*.md")):
        if p.name not in NOT_CHECKED:
            out[f"docs/{p.name}"] = p.read_text()
    return out


@dataclass
class Block:
    lang: str
    lines: list[str]
    at: int  # the line number of its opening fence


def split_fences(text: str) -> tuple[list[tuple[int, str]], list[Block]]:
    """The lines outside fenced code blocks (with their numbers) and the blocks."""
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    current: Block | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current = Block(line[3:].strip().lower(), [], n)
            else:
                blocks.append(current)
                current = None
            continue
        if current is None:
            prose.append((n, line))
        else:
            current.lines.append(line)
    assert current is None, f"a code block opened at line {current.at} is never closed"
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation (backticks
    too) dropped, spaces to hyphens; '-' and '_' stay."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    prose, _ = split_fences(text)
    return [(len(m.group(1)), m.group(2).strip()) for _, line in prose
            if (m := re.match(r"(#{1,6}) +(.+?) *#*$", line))]


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2 ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, h in headings(text):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def links(text: str) -> list[tuple[int, str]]:
    prose, _ = split_fences(text)
    return [(n, m.group(2)) for n, line in prose for m in LINK.finditer(line)]


def broken_links(name: str, text: str, repo: Path = REPO) -> list[str]:
    """Every relative link of page ``name`` that reaches no file, or whose
    ``#anchor`` is no heading of the page it names."""
    here = (repo / name).parent
    bad = []
    for n, target in links(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (here / path).resolve() if path else (repo / name).resolve()
        if not dest.exists() or repo.resolve() not in (dest, *dest.parents):
            bad.append(f"{name}:{n}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{name}:{n}: {target}: no heading #{anchor} in {dest.name}")
    return bad


def contents(text: str) -> list[str]:
    """The anchors the README's "Contents" list links to."""
    prose, _ = split_fences(text)
    out, inside = [], False
    for _, line in prose:
        if re.match(r"#+ ", line):
            inside = line.strip("# ").lower() == "contents"
            continue
        if inside and (m := re.match(r"\s*[-*] \[[^\]]+\]\(#([^)]+)\)", line)):
            out.append(m.group(1))
    return out


# ------------------------------------------------------------------ commands


@dataclass
class Cli:
    """A command's long options, and its subcommands' (empty: it has none)."""

    options: set[str]
    commands: dict[str, set[str]] = field(default_factory=dict)


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def argparse_of(call: Callable[[], Any]) -> argparse.ArgumentParser:
    """The parser a command's ``main`` builds, caught at ``parse_args``
    (before the command does anything)."""
    def catch(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        raise _Caught(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            call()
        except _Caught as c:
            return c.parser
    raise AssertionError(f"{call} built no parser")


def cli_of(parser: argparse.ArgumentParser) -> Cli:
    def longs(p: argparse.ArgumentParser) -> set[str]:
        return {s for a in p._actions for s in a.option_strings if s.startswith("--")}

    commands = {name: longs(sub) for a in parser._actions
                if isinstance(a, argparse._SubParsersAction) for name, sub in a.choices.items()}
    return Cli(longs(parser), commands)


def plugin_flags() -> set[str]:
    """Every long option fixtures/plugin.py adds, in any group or on the
    parser itself, declared into a parser that only records."""
    from fixtures import plugin

    flags: set[str] = set()

    class Recorder:
        def addoption(self, *names: str, **kw: Any) -> None:
            flags.update(n for n in names if n.startswith("--"))

        def getgroup(self, *a: Any, **kw: Any) -> Recorder:
            return self

        def addini(self, *a: Any, **kw: Any) -> None:
            pass

    plugin.pytest_addoption(Recorder())
    return flags


def pytest_flags(config: pytest.Config) -> set[str]:
    """What ``pytest --help`` lists: pytest's options and every loaded
    plugin's (Ordeal's, xdist, timeout, asyncio ...), from this session's
    parser."""
    parser = config._parser
    opts = [*parser._anonymous.options, *(o for g in parser._groups for o in g.options)]
    return {n for o in opts for n in o.names() if n.startswith("--")}


@dataclass
class Commands:
    """Ordeal's commands as a command line names them."""

    pytest: set[str]
    ordeal: Cli
    modules: dict[str, Cli]  # python -m MODULE

    def every_option(self) -> set[str]:
        out = set(self.pytest) | self.ordeal.options
        for cli in (self.ordeal, *self.modules.values()):
            out |= cli.options
            for opts in cli.commands.values():
                out |= opts
        return out


def commands(config: pytest.Config) -> Commands:
    import bench.__main__
    import faults.__main__
    import faults.proxy.cli
    import ordeal.__main__ as ordeal_main
    import reports.__main__
    import runs.gpu_scenario

    pytest_opts = pytest_flags(config)
    reports_cli = cli_of(argparse_of(lambda: reports.__main__.main([])))
    faults_cli = cli_of(argparse_of(lambda: faults.__main__.main([])))
    init = cli_of(argparse_of(lambda: ordeal_main._init([]))).options
    by_package = {"reports": reports_cli, "faults": faults_cli}
    sub = {"init": init, **{s: pytest_opts for s in ordeal_main.SUITES},
           # ordeal takes a package's leading options (reports' --runs-dir) anywhere
           **{s: by_package[pkg].commands[s] | set(ordeal_main.LEADING.get(pkg, ()))
              for s, pkg in ordeal_main.DELEGATED.items()}}
    return Commands(
        pytest=pytest_opts,
        ordeal=Cli({"--help"}, sub),
        modules={
            "reports": reports_cli, "faults": faults_cli,
            "faults.proxy": cli_of(argparse_of(lambda: faults.proxy.cli.parse_args([]))),
            "bench": cli_of(argparse_of(bench.__main__.main)),
            "runs.gpu_scenario": cli_of(runs.gpu_scenario.arg_parser()),
            "ordeal": Cli({"--help"}, sub),
            # these two take no option
            "clusters.docker_image": Cli(set()), "clusters.docker_engine_image": Cli(set()),
        })


# ---------------------------------------------------- command lines in the text

OPTION = re.compile(r"--[A-Za-z0-9][A-Za-z0-9-]*")
SHELL = {"", "bash", "sh", "shell", "console"}
PYTHON = re.compile(r"(?:\S*/)?python[0-9.]*")


def code_spans(line: str) -> list[str]:
    return re.findall(r"`([^`]+)`", line)


def shell_lines(text: str) -> Iterator[tuple[int, str]]:
    """Every line that may hold a command: each line of a shell block
    (continuations joined) and each code span of the prose."""
    prose, blocks = split_fences(text)
    for n, line in prose:
        for span in code_spans(line):
            yield n, span
    for b in blocks:
        if b.lang not in SHELL:
            continue
        joined, start = "", 0
        for i, line in enumerate(b.lines, b.at + 1):
            if not joined:
                start = i
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            yield start, joined + line
            joined = ""


def tokens(line: str) -> list[str]:
    line = line.strip().removeprefix("$ ")
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unclosed quote in prose: whitespace, up to a comment
        return re.split(r"\s+", re.sub(r"(^|\s)#.*", "", line).strip())


def segments(toks: list[str]) -> Iterator[list[str]]:
    """Commands joined by &&, ||, ; or a pipe (a '|' inside [...] is an
    alternative in a usage line, not a pipe)."""
    depth, seg = 0, []
    for t in toks:
        if depth == 0 and t in ("&&", "||", ";", "|"):
            yield seg
            seg = []
            continue
        depth += t.count("[") - t.count("]")
        seg.append(t)
    yield seg


def clean(tok: str) -> str:
    return tok.strip("[](){},.$").split("=", 1)[0]


@dataclass
class Use:
    """One command line of the docs, resolved."""

    where: str
    program: str  # "pytest", "ordeal", or the module of python -m
    options: list[str]  # every token after the program


def uses(where: str, text: str) -> Iterator[Use]:
    """Every command line of Ordeal's the text shows."""
    for n, line in shell_lines(text):
        for seg in segments(tokens(line)):
            seg = [t.removeprefix("$(") for t in seg]
            while seg and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", seg[0]):
                seg = seg[1:]  # VAR=value before a command
            if not seg:
                continue
            if seg[0] == "pytest":
                program, rest = "pytest", seg[1:]
            elif seg[0] == "ordeal":
                program, rest = "ordeal", seg[1:]
            elif PYTHON.fullmatch(seg[0]) and len(seg) > 2 and seg[1] == "-m":
                program, rest = clean(seg[2]), seg[3:]
            else:
                continue
            yield Use(f"{where}:{n}", program, rest)


def wrong_options(where: str, text: str, cmds: Commands) -> list[str]:
    """Options (and subcommands) the text gives a command of Ordeal's that
    the command does not have."""
    bad = []
    for use in uses(where, text):
        if use.program == "pytest":
            cli = Cli(cmds.pytest)
        elif use.program in cmds.modules:
            cli = cmds.modules[use.program]
        else:
            continue  # python -m pip, venv, engines.triton.server ...: not ours to check here
        args = [a for a in map(clean, use.options) if a]  # '...' and the like: none
        allowed, command = cli.options, None
        if cli.commands and args:  # (the program's bare name in prose says nothing)
            command = next((a for a in args if a in cli.commands),
                           next((a for a in args if a and not a.startswith("-")), None))
            if command is None:
                if not any(a in ("--help", "-h") for a in args):
                    bad.append(f"{use.where}: {use.program} without a command")
                continue
            if command not in cli.commands:
                bad.append(f"{use.where}: {use.program} {command}: no such command "
                           f"(there are {', '.join(sorted(cli.commands))})")
                continue
            before = args[:args.index(command)]
            for a in before:
                if OPTION.fullmatch(a) and a not in cli.options:
                    bad.append(f"{use.where}: {use.program} {a}: no such option")
            args = args[args.index(command) + 1:]
            allowed = cli.commands[command] | {"--help"}
        for a in args:
            if OPTION.fullmatch(a) and a not in allowed:
                bad.append(f"{use.where}: {use.program}{' ' + command if command else ''} "
                           f"{a}: no such option")
    return bad


def stray_options(where: str, text: str, known: set[str]) -> list[str]:
    """Every --option written anywhere but in a non-shell code block
    (TOML, Python, output) that is neither one of Ordeal's commands' nor
    listed in OTHER_TOOLS."""
    prose, blocks = split_fences(text)
    lines = [*prose, *((b.at + i, line) for b in blocks if b.lang in SHELL
                       for i, line in enumerate(b.lines, 1))]
    bad = []
    for n, line in lines:
        for m in re.finditer(r"(?<![\w-])(--[A-Za-z][A-Za-z0-9-]*)", line):
            if m.group(1) not in known and m.group(1) not in OTHER_TOOLS:
                bad.append(f"{where}:{n}: {m.group(1)}")
    return bad


def ordeal_commands_shown(where: str, text: str) -> set[str]:
    return {next((c for t in u.options if (c := clean(t)) and not c.startswith("-")), "")
            for u in uses(where, text) if u.program == "ordeal"} - {""}


# ------------------------------------------------------------------ tables


def table_rows(text: str, header: str = "option") -> list[tuple[int, str]]:
    """The first cells of the rows of every table whose first column is
    ``header``, as written (a code span's text)."""
    prose, _ = split_fences(text)
    out, inside = [], False
    for n, line in prose:
        if not line.startswith("|"):
            inside = False
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not inside:
            inside = cells[0].lower() == header
            continue
        if set(cells[0]) <= set("-: "):
            continue
        out.append((n, cells[0].strip("`")))
    return out


# ------------------------------------------------------------------ TOML files


def toml_blocks(text: str) -> list[Block]:
    return [b for b in split_fences(text)[1] if b.lang == "toml"]


def toml_kind(block: Block) -> str | None:
    first = block.lines[0] if block.lines else ""
    m = re.match(r"#\s*(\S+\.toml)\b", first)
    if not m:
        return None
    name = m.group(1)
    if name in ("ordeal.toml", "pyproject.toml", "slo.toml", "thresholds.toml",
                "known-findings.toml", "target.toml"):
        return name
    return "target.toml" if "target file" in first else None


def stack_file_problems(where: str, block: Block, tmp: Path) -> list[str]:
    """A stack file block read as the plugin reads one: every key an
    option, every value of its type; commented keys must be options too."""
    from fixtures import plugin
    from ordeal import stack_file
    from ordeal.config import ConfigError

    plugin_flags()  # fills plugin.OPTIONS
    kind = toml_kind(block)
    path = tmp / ("pyproject.toml" if kind == "pyproject.toml" else "ordeal.toml")
    path.write_text("\n".join(block.lines) + "\n")
    problems = []
    try:
        stack = stack_file.find(str(path), tmp)
        assert stack is not None
        stack_file.apply(stack, plugin.OPTIONS, set())
    except ConfigError as e:
        problems.append(f"{where}: {e}")
    for line in block.lines[1:]:
        if (m := re.match(r"#\s*([A-Za-z][\w-]*)\s*=", line.strip())) \
                and m.group(1).replace("-", "_") not in plugin.OPTIONS:
            problems.append(f"{where}: commented key {m.group(1)!r} is not an option")
    return problems


def file_problems(where: str, block: Block, tmp: Path) -> list[str]:
    """A TOML block read by the code that reads that file."""
    from invariants.known import read_known_findings
    from invariants.settings import settings_from_file
    from ordeal.config import ConfigError
    from ordeal.target import read_target_file
    from reports.thresholds import load_thresholds

    kind = toml_kind(block)
    if kind is None:
        return [f"{where}: a ```toml block whose first line does not say what file it is "
                f"(# ordeal.toml, # target.toml, ...)"]
    if kind in ("ordeal.toml", "pyproject.toml"):
        return stack_file_problems(where, block, tmp)
    text = "\n".join(block.lines) + "\n"
    path = tmp / kind
    path.write_text(text)
    readers = {"slo.toml": settings_from_file, "thresholds.toml": load_thresholds,
               "known-findings.toml": read_known_findings, "target.toml": read_target_file}
    if kind == "target.toml":  # a CA file it names must exist: an empty one will do
        tls = tomllib.loads(text).get("tls", {})
        if isinstance(tls, dict) and isinstance(tls.get("ca_file"), str):
            (tmp / tls["ca_file"]).write_text("")
    try:
        readers[kind](path)
    except (ConfigError, ValueError) as e:
        return [f"{where}: as {kind}: {e}"]
    return []


# ------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def cmds(pytestconfig: pytest.Config) -> Commands:
    return commands(pytestconfig)


def test_the_readme_is_short_with_contents_and_every_page_linked():
    text = README.read_text()
    n = len(text.splitlines())
    assert n < MAX_README_LINES, f"README.md has {n} lines; the reference goes in docs/"
    toc = contents(text)
    assert len(toc) >= 5, "README.md needs a '## Contents' list of links to its sections"
    missing = [a for a in toc if a not in anchors(text)]
    assert not missing, f"contents links to no heading: {missing}"
    sections = [slug(h) for level, h in headings(text) if level == 2 and slug(h) != "contents"]
    assert [s for s in sections if s not in toc] == [], "a section the contents leave out"
    linked = {t.partition("#")[0] for _, t in links(text)}
    unlinked = [p for p in pages() if p != "README.md" and p not in linked]
    assert not unlinked, f"pages the README does not link: {unlinked}"
    assert "docs/DEVELOPING.md" in linked


def test_every_link_reaches_a_file_and_a_heading():
    bad = [b for name, text in pages().items() for b in broken_links(name, text)]
    assert not bad, "\n".join(bad)


def test_every_option_the_docs_give_exists(cmds):
    bad = [b for name, text in pages().items() for b in wrong_options(name, text, cmds)]
    assert not bad, "\n".join(bad)
    known = cmds.every_option()
    stray = [b for name, text in pages().items() for b in stray_options(name, text, known)]
    assert not stray, ("options that are no command's (a typo, or another tool's: add it "
                       "to OTHER_TOOLS with why):\n" + "\n".join(stray))
    clash = sorted(set(OTHER_TOOLS) & known)
    assert not clash, f"OTHER_TOOLS lists options Ordeal's commands or pytest have: {clash}"


def test_every_plugin_option_is_documented_and_every_row_is_an_option():
    from fixtures import plugin

    flags = plugin_flags()
    assert flags == {info.flag for info in plugin.OPTIONS.values()}, \
        "an option outside OPTIONS: the stack file cannot set it"
    rows = {f for _, f in table_rows((DOCS / "options.md").read_text())}
    assert sorted(flags - rows) == [], "options without a row in docs/options.md"
    bad = [f"{name}:{n}: {f}" for name, text in pages().items()
           for n, f in table_rows(text) if f not in flags]
    assert not bad, "rows of an options table that are not options:\n" + "\n".join(bad)


def test_every_ordeal_command_shown_exists_and_every_one_is_shown(cmds):
    import ordeal.__main__ as ordeal_main

    real = {"init", *ordeal_main.SUITES, *ordeal_main.DELEGATED}
    assert set(cmds.ordeal.commands) == real
    shown = set().union(*(ordeal_commands_shown(n, t) for n, t in pages().items()))
    assert sorted(shown - real) == [], "ordeal commands the docs show that do not exist"
    assert sorted(real - shown) == [], "ordeal commands the docs never show"
    # (wrong_options, above, also refuses an unknown command of python -m reports|faults)


def test_every_toml_block_is_a_file_its_reader_takes(tmp_path):
    problems = []
    for name, text in pages().items():
        for i, block in enumerate(toml_blocks(text)):
            d = tmp_path / f"{name.replace('/', '_')}-{i}"
            d.mkdir()
            problems += file_problems(f"{name}:{block.at}", block, d)
    assert not problems, "\n".join(problems)
    shown = {toml_kind(b) for t in pages().values() for b in toml_blocks(t)}
    assert {"ordeal.toml", "target.toml"} <= shown


def test_the_checks_catch(cmds, tmp_path):
    """Each check above, on text with one mistake planted, finds it."""
    planted = ("```bash\n.venv/bin/python -m pytest suites/ -m smoke --load-duraton 2m\n"
               "ordeal smoke --replicas 3 && ordeal show --runs-dir x --faults --json\n"
               "ordeal smok\npython -m faults heal-everything\n```\n"
               "Run `ordeal endurance --duraton 72h` or `python -m bench --onyl zoo`.\n")
    bad = wrong_options("planted", planted, cmds)
    assert any("--load-duraton" in b for b in bad), bad
    assert any("show --json" in b for b in bad), bad  # compare-baseline's, not show's
    assert not any("--runs-dir" in b or "--faults" in b for b in bad), bad
    assert any("ordeal smok: no such command" in b for b in bad), bad
    assert any("faults heal-everything: no such command" in b for b in bad), bad
    assert any("--duraton" in b for b in bad) and any("--onyl" in b for b in bad), bad
    assert not any("--replicas" in b for b in bad), bad
    assert stray_options("planted", "pass `--no-such-flag` here\n",
                         cmds.every_option()) == ["planted:1: --no-such-flag"]
    assert stray_options("ok", "`--replicas 3`, `--max-num-seqs 32`\n", cmds.every_option()) == []
    assert ordeal_commands_shown("p", "`ordeal smoke -x` and `ordeal frob`") == {"smoke", "frob"}
    table = "| option | default |\n|---|---|\n| `--replicas` | 2 |\n| `--replicaz` | 2 |\n"
    assert [f for _, f in table_rows(table)] == ["--replicas", "--replicaz"]
    # links and anchors
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Two words `here`\n")
    page = "[ok](docs/a.md#two-words-here) [gone](docs/b.md) [no](docs/a.md#three)\n"
    assert [b.split(": ")[1] for b in broken_links("README.md", page, tmp_path)] == [
        "docs/b.md", "docs/a.md#three"]
    assert contents("## Contents\n\n- [X](#x)\n- [Y](#y)\n\n## X\n") == ["x", "y"]
    # stack files: an unknown key, a commented one, a value of the wrong type
    block = Block("toml", ["# ordeal.toml", "replicaz = 3", "# load-rat = 8",
                           'replicas = "two"'], 1)
    problems = stack_file_problems("planted", block, tmp_path)
    assert len(problems) == 2 and "'replicaz' is not an option" in problems[0], problems
    assert "replicas = 'two'" in problems[0] and "'load-rat'" in problems[1], problems
    unlabelled = Block("toml", ["replicas = 3"], 1)
    assert "does not say what file" in file_problems("p", unlabelled, tmp_path)[0]
    target = Block("toml", ["# target.toml", 'entrypoint = "http://127.0.0.1:1"',
                            'model = "m"', "replicaz = 1"], 1)
    assert "replicaz" in file_problems("p", target, tmp_path)[0]
