"""``python -m faults heal-all``: heal what a crashed run left in the ledger.

Prints one line per entry. Process faults whose cluster is gone need no
repair (the next suite start ends leftover processes by their recorded ids);
their entries are closed and reported.
"""

from __future__ import annotations

import argparse
import sys

from .heal_all import heal_all
from .ledger import Ledger


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faults", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("heal-all", help="heal every fault still in the ledger")
    h.add_argument("--ledger-dir", default=None, help="ledger directory (default: the state dir)")
    sub.add_parser("list", help="list the faults still in the ledger, and the known kinds")
    args = ap.parse_args(argv)
    ledger = Ledger(getattr(args, "ledger_dir", None))
    if args.cmd == "list":
        pending = ledger.pending()
        for e in pending:
            print(e if isinstance(e, str) else f"{e.id} {e.kind} on {e.target} "
                  f"(run {e.run_id}, since {e.injected})")
        print(f"{len(pending)} fault(s) in {ledger.dir}")
        from .catalogue import KINDS
        print(f"known kinds: {', '.join(KINDS)}")
        return 0
    lines = heal_all(ledger)
    for line in lines:
        print(line)
    print(f"healed {len(lines)} ledger entr{'y' if len(lines) == 1 else 'ies'} in {ledger.dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. `python -m faults list | head -1`: not an error
        sys.stderr.close()
        sys.exit(0)
