"""Node-level faults only a multi-node engine has, on ``--cluster ray``:
lose a Ray node, or pause it, and let Ray reschedule what ran there.

A *Ray node* here is one simulated node the suite started
(``clusters.ray_nodes.RayNode``): one process group holding its raylet,
agents and Ray workers (the replica actors), plus the vLLM engines those
actors started (each a process group of its own, so process faults can hit
one engine alone). Faults reach it only through what the node object
offers (``pid``, ``pids()``, ``signal``, ``engines()``, ``start``); no
backend is imported here.

- ``ray_node_loss``: SIGKILL the node's group and every engine on it, as a
  host that dies takes its processes with it. Ray's GCS then declares the
  node dead (about 3 s with the suite's health-check settings) and restarts
  each replica actor on a node with a free slot; the actor starts the
  engine there, on the same port. Heal starts the node again (it joins with
  a new node id) and waits until every lost replica serves, wherever it
  runs now; the heal result says where and how long after the kill.
- ``ray_node_pause``: SIGSTOP the same processes; heal SIGCONTs them. Held
  longer than Ray's health check, Ray declares the node dead and moves its
  replicas while the paused engine still holds its port; heal then ends
  that orphaned engine (ours, checked by pid + start time + label), lets the
  actor start a fresh one where Ray put it, and restarts the node if Ray
  told its raylet to exit.

Leftovers of a crashed harness (``remove_leftovers``, run by
``python -m faults heal-all`` and at every suite start): the process groups
of Ray clusters whose harness is gone, by the suite's process records
(``ordeal.ownership``), and the Ray temp dirs (``/tmp/ordeal-ray-*``) and
cgroups whose owner file names a dead harness. Nothing without our record or
marker is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ordeal import cgroup2, procfs
from ordeal.config import state_dir
from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.ownership import (
    Busy,
    Claimer,
    Owner,
    exclusive,
    left_claims,
    read_records,
    reap_leftovers,
)

from . import iptables
from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry
from .node_processes import is_same, kill_members
from .process_pause import Member, continue_members, snapshot, wait_states

RAY_TEMP_PREFIX = "ordeal-ray-"
#: After a pause or partition ends, how long Ray may still take to declare
#: the node dead: a health check in flight (timeout 1 s) and the failures
#: counted so far (3 of them at 1 s intervals, set by the suite's nodes).
VERDICT_SETTLE_S = 5.0
#: How many times a heal starts a node that Ray must take back. Ray gives a
#: starting raylet 30 s to register with the GCS (hard-coded in
#: ``ray._private.node``); on a loaded 2-core machine one start in many runs
#: missed it (docs/DEVELOPING.md, "Ray restart"). A second start is the
#: harness restoring its cluster, not a verdict; each failed start is kept
#: in the heal's record as ``node_start_failures``.
NODE_START_ATTEMPTS = 2
RAY_OWNER_FILE = "ordeal-owner"


def _members(node: Any) -> tuple[list[Member], list[dict[str, Any]]]:
    """The node's own processes and those of the engines Ray placed on it
    (refreshed from their actors first), as the ledger keeps them."""
    engines = []
    for r in node.engines_refreshed() if hasattr(node, "engines_refreshed") else node.engines():
        if r.pid and r.is_running():
            engines.append({"name": r.name, "pgid": r.pid, "pids": r.pids()})
    pids = list(node.pids()) + [p for e in engines for p in e["pids"]]
    return snapshot(pids), engines


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if procfs.state(p) not in (None, "Z")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


#: Why the Chaos Mesh export has no equivalent of the Ray node kinds.
RAY_ONLY = "a Ray-only kind (--cluster ray's simulated Ray nodes); it has no meaning for pods"


class _RayNodeFault(Fault):
    needs_root = False

    def __init__(self, node: Any, run_id: str, ledger: Ledger, restart: bool = True,
                 ready_timeout_s: float = 300.0):
        super().__init__(node.name, run_id, ledger)
        self.node = node
        self.restart = restart
        self.ready_timeout_s = ready_timeout_s
        self._t_act: float | None = None
        self._declared_dead: bool | None = None  # by Ray, seen at heal
        self._engines: list[dict[str, Any]] = []

    def _preflight(self) -> None:
        if not hasattr(self.node, "engines"):
            raise FaultError(f"{self.kind}: {self.node.name} is not a Ray node of this cluster; "
                             "node faults need --cluster ray (targets: cluster.ray_nodes)")
        if getattr(self.node, "head", False):
            raise FaultError(f"{self.kind}: {self.node.name} is the Ray head (GCS); losing it "
                             "loses the cluster, not a node. Target a worker node "
                             "(ray-node-0, ...)")
        if not self.node.is_running():
            raise FaultError(f"{self.kind}: Ray node {self.node.name} is not running; heal it "
                             "first or target a live node")

    def _inverse(self) -> dict[str, Any]:
        members, engines = _members(self.node)
        if not members:
            raise FaultError(f"{self.kind}: Ray node {self.node.name} has no labelled process")
        self._engines = engines
        return {"action": self.kind, "node": self.node.name, "pgid": self.node.pid,
                "node_id": self.node.node_id, "engines": [e["name"] for e in engines],
                "members": [asdict(m) for m in members]}

    def _recorded(self) -> list[Member]:
        assert self.entry is not None
        return [Member(**m) for m in self.entry.inverse["members"]]

    def _lost_replicas(self) -> list[Any]:
        assert self.entry is not None
        names = set(self.entry.inverse["engines"])
        return [r for r in self.node.cluster.replicas() if r.name in names]

    def _recover(self) -> dict[str, Any]:
        """The node's processes run again (or are gone): end what Ray
        orphaned meanwhile, restart the node if it is down, wait until its
        replicas serve."""
        assert self.entry is not None
        return {"orphans_ended": self._end_orphans(), "declared_dead": self._declared_dead,
                **self._bring_back(self.entry.inverse.get("node_id"))}

    def _bring_back(self, lost_node_id: str | None) -> dict[str, Any]:
        """Restart the node if it is down, then wait until every replica
        that ran on it serves again, wherever Ray runs it now."""
        t0 = time.monotonic()
        out: dict[str, Any] = {}
        if self.restart and not self.node.is_running():
            failures = self._start_node()
            if failures:
                out["node_start_failures"] = failures
            out["node_restarted"] = True
            out["node_up_after_s"] = round(time.monotonic() - t0, 2)
            out["new_node_id"] = (self.node.node_id or "")[:12]
        placed = {}
        lost = self._lost_replicas()
        for r in lost:  # all started first: they load side by side
            if not r.is_running():
                # The actor runs (restarted by Ray, or never moved) but its
                # engine is gone: have the actor start it where it is.
                try:
                    r.refresh(timeout=30)
                    if not r.info.get("running"):
                        r.start()
                except Exception:  # noqa: BLE001 - still restarting: wait_ready waits
                    pass
        for r in lost:
            r.wait_ready(self.ready_timeout_s)
            where = self.node.cluster.ray_node_of(r)
            placed[r.name] = {
                "now_on": where.name if where else (r.node_id or "?")[:12],
                "moved": r.node_id != lost_node_id,
                "serving_after_inject_s": (round(time.monotonic() - self._t_act, 2)
                                           if self._t_act else None)}
        out["replicas"] = placed
        out["heal_s"] = round(time.monotonic() - t0, 2)
        return out

    def _start_node(self) -> list[str]:
        """Start the node, once more if Ray did not take the first start
        (see NODE_START_ATTEMPTS); returns why each failed start failed.
        The last failure is raised with the node's and the GCS's log."""
        failures: list[str] = []
        for attempt in range(1, NODE_START_ATTEMPTS + 1):
            try:
                self.node.start()
                return failures
            except RuntimeError as e:  # RayError: the node did not join
                failures.append(str(e).splitlines()[0])
                if attempt == NODE_START_ATTEMPTS:
                    raise
                self.node.stop()
        return failures

    def _end_orphans(self) -> list[str]:
        """Ray may have declared the node dead meanwhile: its raylet then
        exits on its own, and the replicas' actors run elsewhere. An engine
        left from before the fault whose actor moved is an orphan holding
        the replica's port: end it (it is one of the recorded members).
        A node Ray declared dead is left to exit (or stopped) so that the
        heal starts it again. Returns the replicas whose engine was
        orphaned."""
        assert self.entry is not None
        # Ray's verdict can land just after the heal (an endurance run:
        # a 6 s partition, declared dead a moment after its rules were gone,
        # and the node left the cluster for good). Watch for it first.
        deadline = time.monotonic() + VERDICT_SETTLE_S
        while not self.node.declared_dead() and time.monotonic() < deadline:
            time.sleep(0.5)
        orphans = []
        for r in self._lost_replicas():
            try:
                r.refresh(timeout=15)
            except Exception:  # noqa: BLE001 - being restarted: it moved
                r.info = {**r.info, "node_id": None}
            if r.node_id != self.entry.inverse.get("node_id"):
                orphans.append(r.name)
        # Ray may have declared the node dead with no replica on it too (an
        # endurance run met that: the node then left on its own a moment
        # after a heal that had found nothing to do, and stayed down).
        dead = bool(orphans) or self.node.declared_dead()
        self._declared_dead = dead
        if dead:
            # Its raylet exits on its own once it runs again and hears so
            # (seen within a few seconds); a node that has not heard after
            # 10 s is stopped, so that _bring_back starts it afresh.
            deadline = time.monotonic() + 10
            while self.node.is_running() and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.node.is_running():
                self.node.stop()
        if dead or not self.node.is_running():
            engine_pids = {m.pid for m in self._recorded()} - set(self.node.pids())
            stale = [m for m in self._recorded() if m.pid in engine_pids]
            _wait_gone(kill_members(stale))
        return orphans


class RayNodeLoss(_RayNodeFault):
    kind = "ray_node_loss"
    traits = KindTraits(kind, backends=("ray",), stops_target=True, restarts_target=True,
                        endurance=EnduranceChoice("one", position=12),
                        chaos_mesh_none=RAY_ONLY)
    needs_root = False
    privilege = ("SIGKILLs the processes of a simulated Ray node the harness started (its "
                 "raylet, workers and the engines on it) and starts the node again")

    def _act(self) -> dict[str, Any]:
        members = self._recorded()
        self._t_act = time.monotonic()
        self.node.signal(signal.SIGKILL)  # the node's group, whatever forked since
        killed = kill_members(members)
        left = _wait_gone([m.pid for m in members])
        if left:
            raise RuntimeError(f"ray_node_loss: {self.node.name}: {left} still run 15 s after "
                               "SIGKILL")
        return {"signal": "SIGKILL", "node_pgid": self.entry.inverse["pgid"] if self.entry
                else None, "killed": len(killed), "engines": self.entry.inverse["engines"]
                if self.entry else []}

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """Nothing: the killed processes are gone."""
        return {}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        return (f"{healed(entry, 'closed')}: its Ray cluster went with its harness, nothing to "
                "restart (its processes are ended by their records: heal-all, or the next "
                "suite start)")

    def observe(self) -> Effect:
        """Every recorded process of the node (raylet, workers, the engines
        on it) is gone, as /proc shows it: one still there was not killed."""
        members = self._recorded()
        left = [m.pid for m in members if is_same(m)]
        return Effect(bool(members) and not left,
                      "each recorded process of the node in /proc (gone)",
                      {"processes": len(members), "still_running": left[:20]})

    def _recover(self) -> dict[str, Any]:
        assert self.entry is not None
        return {"action": "restart", **self._bring_back(self.entry.inverse.get("node_id"))}


class RayNodePause(_RayNodeFault):
    kind = "ray_node_pause"
    traits = KindTraits(kind, backends=("ray",), stops_target=True,
                        endurance=EnduranceChoice("one", position=13),
                        chaos_mesh_none=RAY_ONLY)
    needs_root = False
    privilege = ("sends SIGSTOP/SIGCONT to the processes of a simulated Ray node the harness "
                 "started (raylet, workers and the engines on it)")

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None
        self._t_act = time.monotonic()
        self.node.signal(signal.SIGSTOP)
        for m in self._recorded():
            try:
                os.kill(m.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        pids = [m.pid for m in self._recorded()]
        not_stopped = wait_states(pids, stopped=True)
        if not_stopped:
            raise RuntimeError(f"ray_node_pause: {self.node.name}: {not_stopped} not stopped "
                               "10 s after SIGSTOP")
        return {"signal": "SIGSTOP", "pids": len(pids), "engines": self.entry.inverse["engines"]}

    def observe(self) -> Effect:
        """Each recorded process of the node that still lives is stopped
        (state T in /proc) while the fault is in, and at least one does (a
        Ray worker may exit between the snapshot and the SIGSTOP)."""
        states = {m.pid: procfs.state(m.pid) for m in self._recorded() if is_same(m)}
        stopped = [p for p, st in states.items() if st in ("T", "t")]
        return Effect(bool(states) and len(stopped) == len(states),
                      "the state of each paused process of the node (/proc/PID/stat)",
                      {"stopped": len(stopped), "processes": len(states),
                       "gone": len(self._recorded()) - len(states)})

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """SIGCONT every recorded member that is still that process."""
        continued, gone = continue_members([Member(**m) for m in entry.inverse["members"]])
        wait_states(continued, stopped=False)
        return {"signal": "SIGCONT", "continued": len(continued), "gone": len(gone)}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        return (f"{healed(entry)}: SIGCONT to {done['continued']} process(es); {done['gone']} "
                "gone or no longer ours")


# -- a node cut off from the head -------------------------------------------

#: iptables' multiport match takes at most 15 ports, a range counting two.
MULTIPORT_MAX = 15


def port_lists(ports: Any) -> list[str]:
    """``ports`` (a RayPorts: single ports and one worker range) as
    multiport ``--dports`` arguments of at most 15 slots each."""
    items = [str(p) for p in ports.ports] + [f"{ports.workers[0]}:{ports.workers[1]}"]
    out: list[str] = []
    current: list[str] = []
    used = 0
    for item in items:
        cost = 2 if ":" in item else 1
        if used + cost > MULTIPORT_MAX:
            out.append(",".join(current))
            current, used = [], 0
        current.append(item)
        used += cost
    if current:
        out.append(",".join(current))
    return out


def partition_rules(cgroup: str, own: Any, peers: list[Any]) -> list[tuple[str, ...]]:
    """Rules (argv after ``-A <chain>``, OUTPUT hook) that cut a node in
    cgroup ``cgroup`` from the rest of the Ray cluster, both ways:

    - packets its processes send to a Ray port of a peer (the head's GCS,
      another node's raylet, a driver's or actor's worker port) are dropped;
    - packets anyone outside its cgroup sends to one of its Ray ports are
      dropped (the GCS's health checks, calls to its actors).

    Every node shares 127.0.0.1, so the sender is told by the socket's
    cgroup and the receiver by its port. An engine's serving port is not a
    Ray port: the router still reaches the engines on the node, as it would
    a host cut off from its cluster's control plane only."""
    if not cgroup.startswith("/"):
        raise FaultError(f"ray_node_partition: cgroup {cgroup!r} must be a path under the "
                         "cgroup v2 root, starting with '/'")
    rules: list[tuple[str, ...]] = []
    for peer in peers:
        for dports in port_lists(peer):
            rules.append(("-p", "tcp", "-m", "cgroup", "--path", cgroup,
                          "-m", "multiport", "--dports", dports, "-j", "DROP"))
    for dports in port_lists(own):
        rules.append(("-p", "tcp", "-m", "multiport", "--dports", dports,
                      "-m", "cgroup", "!", "--path", cgroup, "-j", "DROP"))
    return rules


class RayNodePartition(_RayNodeFault):
    """Cut a node off from the head: its raylet misses the GCS's health
    checks, Ray declares it dead and restarts its actors elsewhere, while
    its engines keep running and (through the router) keep serving. Heal
    removes the rules; the node hears it was declared dead and exits, its
    orphaned engines are ended, the moved actors start theirs, the node is
    started again. Needs root (iptables) and the node in a cgroup of its own
    (``RayNode.cgroup``: cgroup v2, made by the cluster)."""

    kind = "ray_node_partition"
    traits = KindTraits(kind, backends=("ray",), stops_target=True,
                        endurance=EnduranceChoice("one", position=14),
                        chaos_mesh_none=RAY_ONLY)
    needs_root = True
    privilege = ("adds iptables rules (a chain ORDEAL-<id>, jumped to from OUTPUT) that "
                 "match the simulated Ray node's cgroup and Ray's ports: CAP_NET_ADMIN")
    without_root = "ray_node_pause (no root): the node falls silent the same way to Ray"
    capabilities = ("CAP_NET_ADMIN",)
    tools = ("iptables",)

    def _preflight(self) -> None:
        super()._preflight()
        if getattr(self.node, "cgroup", None) is None:
            why = getattr(self.node, "cgroup_unavailable", None) or "it has none"
            raise FaultError(f"ray_node_partition: {self.node.name} does not run in a cgroup "
                             f"of its own ({why}); the partition needs cgroup v2 and root")
        iptables.require_usable()
        self._rules()

    def _peers(self) -> list[Any]:
        cluster = self.node.cluster
        return [n for n in [cluster.head, *cluster.ray_nodes]
                if n is not None and n is not self.node and n.ray_ports is not None]

    def _rules(self) -> list[tuple[str, ...]]:
        return partition_rules(self.node.cgroup, self.node.ray_ports,
                               [p.ray_ports for p in self._peers()])

    def _inverse(self) -> dict[str, Any]:
        return {**super()._inverse(), "chain": f"{iptables.CHAIN_PREFIX}<fault id>",
                "cgroup": self.node.cgroup, "rules": [list(r) for r in self._rules()]}

    @property
    def chain(self) -> str:
        assert self.entry is not None
        return iptables.chain_name(self.entry.id)

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None
        rules = self._rules()
        self._t_act = time.monotonic()
        iptables.create_chain(iptables.ChainSpec(
            self.chain, iptables.comment_for(self.run_id, self.entry.id), tuple(rules),
            hooks=("OUTPUT",)))
        return {"chain": self.chain, "cgroup": self.node.cgroup, "rules": len(rules),
                "cut_from": [p.name for p in self._peers()],
                "engines": self.entry.inverse["engines"]}

    def dropped(self) -> int:
        """Packets the partition's rules dropped so far."""
        return sum(c.packets for c in iptables.counters(self.chain))

    def observe(self) -> Effect:
        """Packets the partition's rules matched, from the kernel's counters:
        none dropped means the cut cut nothing."""
        dropped = self.dropped()
        return Effect(dropped > 0, "packets dropped by the partition's chain (iptables -L -v)",
                      {"dropped_packets": dropped, "chain": self.chain})

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """Count what the rules dropped, then remove the chain."""
        chain = iptables.chain_name(entry.id)
        dropped = (sum(c.packets for c in iptables.counters(chain))
                   if iptables.chain_exists(chain) else 0)
        removed = iptables.remove_chain(chain)
        return {"chain": chain, "existed": removed["existed"],
                "jumps_removed": removed["jumps_removed"], "dropped_packets": dropped}

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        return (f"{healed(entry)}: {'removed' if done['existed'] else 'found no'} chain "
                f"{done['chain']} ({done['jumps_removed']} jump(s) removed); the node's "
                "processes are ended by their records")


# -- leftovers of a crashed harness ----------------------------------------

def remove_leftovers(tmp: Path = Path("/tmp")) -> list[str]:
    """End the process groups of Ray clusters whose harness is gone (every
    record of a cluster that has a ``ray-*`` node record: nodes, then
    engines, by ``ordeal.ownership.reap_leftovers``), then remove their Ray
    temp dirs and cgroups. Only recorded groups and dirs with our owner
    marker; a live harness's cluster is left alone.

    Safe beside another cleanup: the groups and the temp dirs are claimed
    one by one (``reap_leftovers``, ``remove_temp_dirs``); the cgroups,
    found by their temp dir being gone, are removed under one lock in the
    state dir, and one that a cleanup of another state dir removed first
    is skipped as done."""
    ray_clusters = {s.record.cluster_id for s in read_records()
                    if s.record is not None and s.record.name.startswith("ray-")}
    lines = reap_leftovers(clusters=ray_clusters) if ray_clusters else []
    try:
        with exclusive(state_dir() / "ray-leftovers.lock"):
            lines += remove_temp_dirs(tmp)
            lines += _remove_cgroups(tmp)
    except Busy as e:
        lines.append(f"left the Ray temp dirs and cgroups to another cleanup: {e}")
    return lines


def remove_temp_dirs(tmp: Path = Path("/tmp")) -> list[str]:
    """Remove the Ray temp dirs (``<tmp>/ordeal-ray-*``) whose owner marker
    names a harness that is gone; one line per dir removed. A dir without
    the marker is not ours and never touched. Each is claimed first
    (``ordeal.ownership.Claimer``: renamed, atomically), so of cleanups at
    once exactly one removes and reports it; one that vanished meanwhile was
    someone else's, and a claim whose cleaner died is taken over."""
    me = Claimer.new()
    found = [(d, d) for d in sorted(tmp.glob(f"{RAY_TEMP_PREFIX}*"))]
    found += [(claim, original) for claim, original in left_claims(tmp)
              if original.name.startswith(RAY_TEMP_PREFIX)]
    lines = []
    for path, original in found:
        try:
            owner = Owner.from_label((path / RAY_OWNER_FILE).read_text().split()[0])
        except (OSError, IndexError):
            continue  # not ours (no marker), or removed meanwhile: never touched
        if owner is not None and owner.alive():
            continue
        mine = me.claim(path) if path == original else me.take_over(path)
        if mine is None:
            continue  # another cleanup has it
        errors: list[str] = []

        def failed(_func: Any, name: str, exc: Any, errors: list[str] = errors) -> None:
            if not isinstance(exc[1], FileNotFoundError):
                errors.append(f"{name}: {exc[1]}")

        shutil.rmtree(mine, onerror=failed)
        if errors:  # the claim stays: the next cleanup, ours gone, takes it over
            lines.append(f"could not remove all of leftover Ray temp dir {original} (now "
                         f"{mine.name}): {'; '.join(errors[:3])}")
        else:
            lines.append(f"removed leftover Ray temp dir {original}")
    return lines


def _remove_cgroups(tmp: Path) -> list[str]:
    """The nodes' cgroups (ray_node_partition), named like the temp dirs:
    a live harness's temp dir is still there, a dead one's was just
    removed. One already gone was removed by someone else."""
    lines = []
    root = cgroup2.mount_point()
    for rel in cgroup2.ours():
        if not rel.startswith(f"/{RAY_TEMP_PREFIX}") or (tmp / rel.lstrip("/")).exists():
            continue
        left = cgroup2.kill_all(rel)  # born on a dead harness's node: ours
        if left:
            lines.append(f"ended {len(left)} leftover process(es) in cgroup {rel}")
        existed = root is not None and (root / rel.lstrip("/")).is_dir()
        problems = cgroup2.remove(rel)
        if problems:
            lines += problems
        elif existed:
            lines.append(f"removed leftover cgroup {rel}")
    return lines
