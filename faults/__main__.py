"""``python -m faults heal-all``: heal what a crashed run left in the ledger.

Prints one line per entry. Process faults whose cluster is gone need no
repair (the next suite start ends leftover processes by their recorded ids);
their entries are closed and reported. Then the Docker containers and
networks of runs whose harness is gone are removed, by label, and the
processes and temp dirs of ``--cluster ray`` runs whose harness is gone
(faults.ray_node.remove_leftovers: by process record and owner marker).
"""

from __future__ import annotations

import argparse
import os
import sys

from .containers import remove_leftovers
from .heal_all import heal_all
from .ledger import Ledger


def catalogue_lines() -> list[str]:
    """One block per kind: ``kind  root: yes|no``, then why (and, for a
    kind that needs root, what to use without it)."""
    from .base import REGISTRY, is_root, user_name
    from .catalogue import KINDS
    lines = []
    for kind in KINDS:
        cls = REGISTRY[kind]
        lines.append(f"{kind:<20} root: {'yes' if cls.needs_root else 'no '}  {cls.privilege}")
        if cls.without_root:
            lines.append(f"{'':<20}       without root: {cls.without_root}")
    from .catalogue import BACKEND_KINDS
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
        from .catalogue import KINDS
        print(f"known kinds: {', '.join(KINDS)}")
        return 0
    lines = heal_all(ledger, force=args.force)
    for line in lines:
        print(line)
    for line in remove_leftovers():
        print(line)
    from .ray_node import remove_leftovers as remove_ray_leftovers
    for line in remove_ray_leftovers():  # Ray nodes, engines and temp dirs of dead harnesses
        print(line)
    healed = [x for x in lines if not x.startswith("left ")]
    print(f"healed {len(healed)} ledger entr{'y' if len(healed) == 1 else 'ies'} in {ledger.dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. `python -m faults list | head -1`: not an error
        sys.stderr.close()
        sys.exit(0)
