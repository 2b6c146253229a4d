"""``python -m faults heal-all``: end what crashed harnesses left behind,
as every suite start does, one line per thing ended. (``python -m faults
export --chaos-mesh FILE`` writes a schedule's Chaos Mesh manifests instead:
faults/chaos_mesh/.)

First the process groups their clusters started (nodes, engines, router,
fault proxy, Ray nodes), by their process records (ordeal.ownership:
by group id, only when the owner harness is gone, and gone when it
returns); then the faults still in the ledger (process faults whose cluster
is gone need no repair: their entries are closed and reported); then the
Docker containers and networks, by label; then the Ray temp dirs and
cgroups (faults.ray_node.remove_leftovers: by owner marker). The sequence
is faults/heal_all.py ``clean_up``, the one every suite start runs too.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ordeal import kinds as kind_traits
from ordeal.config import ConfigError
from ordeal.target import TargetSpec, read_target_file

from . import chaos_mesh
from .base import is_root, user_name
from .catalogue import REGISTRY, backend_kinds, common_kinds
from .heal_all import clean_up
from .ledger import Ledger


def catalogue_lines() -> list[str]:
    """One block per kind: ``kind  root: yes|no``, then why (and, for a
    kind that needs root, what to use without it)."""
    lines = []
    common = common_kinds()
    for kind in common:
        cls = REGISTRY[kind]
        lines.append(f"{kind:<20} root: {'yes' if cls.needs_root else 'no '}  {cls.privilege}")
        if cls.without_root:
            lines.append(f"{'':<20}       without root: {cls.without_root}")
    for kind in backend_kinds():  # one backend's own kinds (ray_node_*: --cluster ray)
        cls = REGISTRY[kind]
        lines.append(f"{kind:<20} root: {'yes' if cls.needs_root else 'no '}  {cls.privilege} "
                     "(--cluster ray only)")
    need = [k for k in common if REGISTRY[k].needs_root]
    lines.append(f"{len(common)} kinds; {len(need)} need root ({', '.join(need)}); this harness "
                 f"runs as {user_name()} (uid {os.geteuid()}): "
                 + ("every kind can be injected" if is_root() else
                    "those are refused before anything is touched"))
    return lines


def target_catalogue_lines(target: TargetSpec) -> list[str]:
    """For an external deployment: how each kind acts on it, or why not."""
    lines = []
    common = common_kinds()
    for kind in common:
        why = target.unsupported(kind)
        if why:
            lines.append(f"{kind:<20} refused: {why}")
        elif kind in kind_traits.link_kinds():
            where = (["Ordeal's fault proxy (client-router)"] if target.fault_proxy else []) + (
                [f"Toxiproxy links {[n for n, _ in target.toxiproxy.links]}"]
                if target.toxiproxy is not None and kind in kind_traits.l4_link_kinds() else [])
            lines.append(f"{kind:<20} acts through {' and '.join(where)}")
        else:
            nodes = sorted({h.node for h in target.hooks if h.kind == kind})
            lines.append(f"{kind:<20} acts through the hooks for {', '.join(nodes)}")
    runs = [k for k in common if not target.unsupported(k)]
    lines.append(f"{len(runs)} of {len(common)} kinds can act on {target.name} "
                 f"({target.path})")
    return lines


EXPORT_DOC = """\
Write the Chaos Mesh manifests of an Ordeal schedule: the same faults at the
same times, for a Kubernetes cluster that runs Chaos Mesh (CRDs checked
against Chaos Mesh v2.8.3). Nothing is applied: the command only writes files.

  OUT/workflow.yaml       one Workflow that runs the whole schedule once
                          (apply it: kubectl apply -f OUT/workflow.yaml)
  OUT/steps/*.yaml        each fault on its own, with its duration (by hand)
  OUT/summary.txt         what was exported, what was not, and why

Each inject, held until its paired heal, becomes one chaos object held that
long. Kinds with no Chaos Mesh equivalent (process_pause, gpu_throttle,
lsn_jump, ...) are left out and listed with the reason; so are targets the
options cannot map. How schedule targets become label selectors:

  one, all             the pods of --selector (every replica pod), mode one/all
  minority, majority   the same, mode fixed with Ordeal's count (--replicas N)
  replica-0, router    the pods of --node NAME=KEY=VALUE[,KEY=VALUE]
  router-replica-0     link: router pods (--node router=...) and the replica's
  client-router        link: router pods and --client-cidr (downstream only)

Exit status: 0 written, 1 nothing could be exported (summary.txt says why),
2 a bad schedule file or option. Details: faults/chaos_mesh/ and
docs/examples/kubernetes/README.md.
"""


def _labels(text: str, opt: str) -> dict[str, str]:
    """``k=v[,k=v]`` -> ``{k: v}``; ExportError naming the option."""
    out = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            raise chaos_mesh.ExportError(f"{opt} {text!r}: expected KEY=VALUE[,KEY=VALUE] "
                                         "(pod labels, e.g. app=vllm)")
        out[k.strip()] = v.strip()
    if not out:
        raise chaos_mesh.ExportError(f"{opt} {text!r}: no label given; expected KEY=VALUE")
    return out


def export_options(args: argparse.Namespace, source: str, run_id: str) -> chaos_mesh.Options:
    selector: dict[str, str] = {}
    for text in args.selector:
        selector.update(_labels(text, "--selector"))
    nodes: dict[str, dict[str, str]] = {}
    for text in args.node:
        name, eq, labels = text.partition("=")
        if not eq or not name.strip():
            raise chaos_mesh.ExportError(
                f"--node {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE], e.g. "
                "replica-0=app=vllm,replica=0 (NAME as the schedule names the node)")
        nodes[name.strip()] = _labels(labels, f"--node {name.strip()}")
    return chaos_mesh.Options(
        namespace=args.namespace, selector=selector, nodes=nodes, replicas=args.replicas,
        client_cidrs=tuple(args.client_cidr), http_port=args.http_port,
        router_http_port=args.router_http_port, container=args.container, kill=args.kill,
        run_id=run_id, source=source, defaults=chaos_mesh.constructor_defaults(REGISTRY))


def export_main(args: argparse.Namespace) -> int:
    """``export --chaos-mesh``: read, map, write, and say what was not exported."""
    def say(line: str) -> None:
        print(f"[export] {line}", flush=True)

    path = Path(args.schedule)
    try:
        opts = export_options(args, path.name, args.run_id or "ordeal")  # options first
        say(f"reading {path}")
        steps = chaos_mesh.read_schedule_file(path)
        run_id = args.run_id or chaos_mesh.default_run_id(path, path.read_bytes())
        x = chaos_mesh.export(steps, replace(opts, run_id=run_id))
    except (chaos_mesh.ExportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    say(f"{len(steps)} steps: {len(x.exported) + len(x.left_out)} fault(s), each an inject held "
        "until its heal")
    for r in sorted([*x.exported, *x.left_out], key=lambda r: r.held.n):
        h = r.held
        head = f"{h.label} at {chaos_mesh.num(h.at_s)} s held {chaos_mesh.num(h.hold_s)} s: " \
               f"{h.kind} on {h.target}"
        if isinstance(r, chaos_mesh.Exported):
            say(f"{head} -> {', '.join(chaos_mesh.describe(c) for c in r.chaos)}")
        else:
            say(f"{head} -> not exported")
    out = Path(args.out or f"chaos-mesh-{run_id}")
    try:
        chaos_mesh.write_export(x, out, args.format, say)
    except (chaos_mesh.ExportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print()
    for line in chaos_mesh.summary_lines(x, out, args.format):
        print(line)
    if not x.exported:
        print(f"error: no fault of {path} could be exported (the reasons are above and in "
              f"{out / chaos_mesh.SUMMARY})", file=sys.stderr)
        return 1
    return 0


def add_export_parser(sub: Any) -> None:
    e = sub.add_parser("export", help="write the Chaos Mesh manifests of a schedule "
                       "(--chaos-mesh)", description=EXPORT_DOC,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--chaos-mesh", action="store_true", required=True,
                   help="write Chaos Mesh objects (the only export there is; required)")
    e.add_argument("schedule", metavar="SCHEDULE_FILE",
                   help="an Ordeal schedule: minimal-schedule.json of an exploration, "
                        "docs/examples/*.json, or an endurance run's endurance.json")
    e.add_argument("--namespace", default="default", metavar="NS",
                   help="namespace of the chaos objects and of the pods they select "
                        "(default: default)")
    e.add_argument("--selector", action="append", default=[], metavar="KEY=VALUE",
                   help="labels every replica pod has and no other pod has (repeat or join "
                        "with commas); needed for the targets one, all, minority, majority")
    e.add_argument("--node", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                   help="the pods of one node the schedule names (replica-0, router), by "
                        "their labels, used as written (not merged with --selector); repeat "
                        "per node. Links need the router's and the replica's")
    e.add_argument("--replicas", type=int, metavar="N",
                   help="how many replica pods --selector matches: the targets minority and "
                        "majority become mode fixed with Ordeal's count")
    e.add_argument("--client-cidr", action="append", default=[], metavar="CIDR",
                   help="where the load comes from (address or CIDR, repeatable): link faults "
                        "on client-router act on the router's packets to it")
    e.add_argument("--http-port", type=int, default=8000, metavar="PORT",
                   help="the replicas' HTTP port, for HTTPChaos (http_fault, connection_reset; "
                        "default 8000)")
    e.add_argument("--router-http-port", type=int, default=None, metavar="PORT",
                   help="the router's HTTP port, for HTTP faults on client-router (default: "
                        "--http-port)")
    e.add_argument("--container", default=None, metavar="NAME",
                   help="the engine's container in the pod (containerNames of TimeChaos, "
                        "StressChaos and container-kill; default: Chaos Mesh's, the first)")
    e.add_argument("--kill", choices=chaos_mesh.KILL_ACTIONS, default="pod-kill",
                   help="process_kill as pod-kill (the pod is deleted, its controller makes a "
                        "new one; default) or container-kill (the kubelet restarts the "
                        "container in place; needs --container)")
    e.add_argument("--run-id", default=None, metavar="ID",
                   help="names the objects (ordeal-ID...) and labels them ordeal/run-id=ID "
                        "(default: the file's stem and 8 hex of its sha256, so the same file "
                        "gives the same names)")
    e.add_argument("--format", choices=("yaml", "json"), default="yaml",
                   help="yaml (default; written without PyYAML) or json; one document per file")
    e.add_argument("--out", default=None, metavar="DIR",
                   help="where to write (default: ./chaos-mesh-<run id>); must be new, empty, "
                        "or an earlier export, whose files are replaced")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faults", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_export_parser(sub)
    h = sub.add_parser("heal-all", help="heal every fault still in the ledger")
    h.add_argument("--ledger-dir", default=None, help="ledger directory (default: the state dir)")
    h.add_argument("--force", action="store_true",
                   help="heal also the faults of a harness that still runs (default: leave "
                        "them to it)")
    sub.add_parser("list", help="list the faults still in the ledger, and the known kinds")
    c = sub.add_parser("catalogue", help="every fault kind, whether it needs root, and why")
    c.add_argument("--target", default=None, metavar="FILE.toml",
                   help="instead: how each kind acts on the deployment this target file "
                        "names (--cluster external): its hook, Ordeal's fault proxy or a "
                        "[toxiproxy] link, or why it cannot")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        return export_main(args)
    if args.cmd == "catalogue":
        if args.target:
            try:
                lines = target_catalogue_lines(read_target_file(args.target))
            except ConfigError as e:
                print(f"python -m faults catalogue: {e}", file=sys.stderr)
                return 2
        else:
            lines = catalogue_lines()
        for line in lines:
            print(line)
        return 0
    ledger = Ledger(getattr(args, "ledger_dir", None))
    if args.cmd == "list":
        pending = ledger.pending()
        for e in pending:
            print(e if isinstance(e, str) else f"{e.id} {e.kind} on {e.target} "
                  f"(run {e.run_id}, since {e.injected})")
        print(f"{len(pending)} fault(s) in {ledger.dir}")
        print(f"known kinds: {', '.join(common_kinds())}")
        return 0
    lines = clean_up(ledger, print, force=args.force)
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
