"""``ordeal`` (or ``python -m ordeal``): one command for a team's whole use.

    ordeal init [--kind KIND | --external URL [--model NAME]] [--path FILE] [--force]
                          write a commented starter stack file (ordeal/starter.py);
                          --external also writes the target file for that URL
    ordeal smoke [PYTEST ARGS...]      pytest --pyargs suites -m smoke ...
    ordeal endurance [PYTEST ARGS...]  pytest --pyargs suites -m endurance ...
    ordeal list | show | compare | compare-baseline | render | open ...
                          the run store (python -m reports ...)
    ordeal heal-all | catalogue | export ...
                          faults left behind, the fault kinds, Chaos Mesh
                          manifests (python -m faults ...)

``smoke`` and ``endurance`` pass every other argument to pytest as it is
(``ordeal smoke --cluster external --target target.toml -x``), and read
``ordeal.toml`` from the current directory like any pytest run here. The
others hand their arguments to the package that owns the command, by module
name (runpy): this module is the lowest layer and imports none above it.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

from .starter import KINDS, starter, target_file

#: Subcommands owned by another package's ``python -m`` interface.
DELEGATED = {
    "list": "reports", "show": "reports", "compare": "reports",
    "compare-baseline": "reports", "render": "reports", "open": "reports",
    "heal-all": "faults", "catalogue": "faults", "export": "faults",
}
#: Subcommands that run the product suites with one marker.
SUITES = {"smoke": "smoke", "endurance": "endurance"}
USAGE = (f"ordeal {{init,{','.join(SUITES)},{','.join(DELEGATED)}}} ...  "
         "(ordeal COMMAND --help for one)")


def _init(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="ordeal init",
                                 description="write a commented starter stack file")
    ap.add_argument("--kind", choices=KINDS, default=None,
                    help="what the stack is: embedded (Ordeal's own CPU stack), own-model "
                         "(your model and flags on Ordeal's replicas), own-image (your "
                         "serving image in Docker), external (a running deployment, e.g. "
                         "Kubernetes, with fault hooks) (default: embedded, or external "
                         "with --external)")
    ap.add_argument("--external", metavar="URL", default=None,
                    help="a running deployment's entrypoint (http[s]://host:port): writes "
                         "the external stack file and its target file (--target-path)")
    ap.add_argument("--model", default=None,
                    help="with --external: the served model name clients send")
    ap.add_argument("--path", default="ordeal.toml", help="where (default: ./ordeal.toml)")
    ap.add_argument("--target-path", default="target.toml",
                    help="with --external: the target file (default: ./target.toml)")
    ap.add_argument("--force", action="store_true", help="replace existing files")
    args = ap.parse_args(argv)
    kind = args.kind or ("external" if args.external else "embedded")
    if args.external and kind != "external":
        ap.error(f"--external names a running deployment: --kind {kind} does not fit it")
    if args.model and not args.external:
        ap.error("--model goes with --external (for the other kinds, edit the file)")
    files = {Path(args.path): starter(kind, target=args.target_path)}
    if args.external:
        try:
            files[Path(args.target_path)] = target_file(args.external, args.model)
        except ValueError as e:
            ap.error(str(e))
    taken = [str(p) for p in files if p.exists()]
    if taken and not args.force:
        print(f"{' and '.join(taken)} {'exists' if len(taken) == 1 else 'exist'}: nothing "
              "written (--force replaces)", file=sys.stderr)
        return 1
    for path, text in files.items():
        path.write_text(text)
    print(f"wrote {', '.join(map(str, files))} ({kind}); edit, then: ordeal smoke "
          f"(or, in a checkout: pytest suites/ -m smoke)")
    return 0


def _suite(marker: str, argv: list[str]) -> int:
    """Become ``python -m pytest --pyargs suites -m MARKER ARGV`` (exec): a
    fresh interpreter, so pytest rewrites the asserts of every module of
    this distribution, none of which may be imported before it starts."""
    os.execv(sys.executable, [sys.executable, "-m", "pytest", "--pyargs", "suites",
                              "-m", marker, *argv])
    return 2  # not reached: execv returns only by raising


#: Options of a package's command line that come before its subcommand
#: there (``python -m reports --runs-dir DIR show``) and anywhere here.
LEADING = {"reports": ("--runs-dir",)}


def _hoist(options: tuple[str, ...], argv: list[str]) -> list[str]:
    """``argv`` with each ``--opt VALUE`` / ``--opt=VALUE`` of ``options``
    moved to the front, before the subcommand."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in options and i + 1 < len(argv):
            front += argv[i:i + 2]
            i += 2
            continue
        (front if arg.split("=", 1)[0] in options else rest).append(arg)
        i += 1
    return front + rest


def _delegate(package: str, argv: list[str]) -> int:
    """Run ``python -m PACKAGE ARGV`` in this process; its exit status back."""
    saved = sys.argv
    sys.argv = [f"ordeal {argv[0]}", *_hoist(LEADING.get(package, ()), argv)]
    try:
        runpy.run_module(package, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip("\n") if argv else f"usage: {USAGE}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "init":
        return _init(rest)
    if command in SUITES:
        return _suite(SUITES[command], rest)
    if command in DELEGATED:
        return _delegate(DELEGATED[command], argv)
    print(f"ordeal: unknown command {command!r}; usage: {USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
