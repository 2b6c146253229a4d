"""``python -m faults heal-all``: end what crashed harnesses left behind,
as every suite start does, one line per thing ended.

First the process groups their clusters started (nodes, engines, router,
fault proxy, Ray nodes), by their process records (ordeal.ownership:
by group id, only when the owner harness is gone, and gone when it
returns); then the faults still in the ledger (process faults whose cluster
is gone need no repair: their entries are closed and reported); then the
Docker containers and networks, by label; then the Ray temp dirs and
cgroups (faults.ray_node.remove_leftovers: by owner marker).
"""

from __future__ import annotations

import argparse
import os
import sys

from ordeal.ownership import reap_leftovers

from .base import is_root, user_name
from .catalogue import BACKEND_KINDS, KINDS, REGISTRY
from .containers import remove_leftovers
from .heal_all import heal_all
from .ledger import Ledger
from .ray_node import remove_leftovers as remove_ray_leftovers


def catalogue_lines() -> list[str]:
    """One block per kind: ``kind  root: yes|no``, then why (and, for a
    kind that needs root, what to use without it)."""
    lines = []
    for kind in KINDS:
        cls = REGISTRY[kind]
        lines.append(f"{kind:<20} root: {'yes' if cls.needs_root else 'no '}  {cls.privilege}")
        if cls.without_root:
            lines.append(f"{'':<20}       without root: {cls.without_root}")
    for kind in BACKEND_KINDS:  # one backend's own kinds (ray_node_*: --cluster ray)
        cls = REGISTRY[kind]
        lines.append(f"{kind:<20} root: {'yes' if cls.needs_root else 'no '}  {cls.privilege} "
                     "(--cluster ray only)")
    need = [k for k in KINDS if REGISTRY[k].needs_root]
    lines.append(f"{len(KINDS)} kinds; {len(need)} need root ({', '.join(need)}); this harness "
                 f"runs as {user_name()} (uid {os.geteuid()}): "
                 + ("every kind can be injected" if is_root() else
                    "those are refused before anything is touched"))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faults", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("heal-all", help="heal every fault still in the ledger")
    h.add_argument("--ledger-dir", default=None, help="ledger directory (default: the state dir)")
    h.add_argument("--force", action="store_true",
                   help="heal also the faults of a harness that still runs (default: leave "
                        "them to it)")
    sub.add_parser("list", help="list the faults still in the ledger, and the known kinds")
    sub.add_parser("catalogue", help="every fault kind, whether it needs root, and why")
    args = ap.parse_args(argv)
    if args.cmd == "catalogue":
        for line in catalogue_lines():
            print(line)
        return 0
    ledger = Ledger(getattr(args, "ledger_dir", None))
    if args.cmd == "list":
        pending = ledger.pending()
        for e in pending:
            print(e if isinstance(e, str) else f"{e.id} {e.kind} on {e.target} "
                  f"(run {e.run_id}, since {e.injected})")
        print(f"{len(pending)} fault(s) in {ledger.dir}")
        print(f"known kinds: {', '.join(KINDS)}")
        return 0
    for line in reap_leftovers():  # first: no heal may reach a process still dying
        print(line)
    lines = heal_all(ledger, force=args.force)
    for line in lines:
        print(line)
    for line in remove_leftovers():
        print(line)
    for line in remove_ray_leftovers():  # Ray temp dirs and cgroups of dead harnesses
        print(line)
    # This pass's own: not entries left to a live harness or another
    # heal-all, nor failed or unreadable ones.
    healed = [x for x in lines if x.startswith(("healed ", "closed "))]
    print(f"healed {len(healed)} ledger entr{'y' if len(healed) == 1 else 'ies'} in {ledger.dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. `python -m faults list | head -1`: not an error
        sys.stderr.close()
        sys.exit(0)
