"""``python -m ordeal init [--kind KIND] [--force] [--path FILE]``: write a
commented starter stack file (ordeal/starter.py) and say what to run next."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .starter import KINDS, starter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ordeal", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write a starter ordeal.toml")
    init.add_argument("--kind", choices=KINDS, default="embedded",
                      help="what the stack is: embedded (Ordeal's own CPU stack), own-model "
                           "(your model and flags on Ordeal's replicas), own-image (your "
                           "serving image in Docker), external (a running deployment, e.g. "
                           "Kubernetes, with fault hooks) (default: embedded)")
    init.add_argument("--path", default="ordeal.toml", help="where (default: ./ordeal.toml)")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    args = ap.parse_args(argv)
    path = Path(args.path)
    if path.exists() and not args.force:
        print(f"{path} exists: nothing written (--force replaces it)", file=sys.stderr)
        return 1
    path.write_text(starter(args.kind))
    print(f"wrote {path} ({args.kind}); edit it, then: pytest suites/ -m smoke")
    return 0


if __name__ == "__main__":
    sys.exit(main())
