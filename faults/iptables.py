"""A thin adapter over the ``iptables`` command: the suite's own chains only.

Every rule the suite adds lives in a chain of its own, ``ORDEAL-<fault id>``,
reached by one jump per hook (INPUT, OUTPUT) that carries the comment
``ordeal:<run_id>:<fault id>``. So a heal is "remove that chain and the jumps
to it", a crashed run's rules are found by name (``python -m faults
heal-all`` needs only the fault id from the ledger), and nothing the suite
does can touch a rule that is not its own: removal refuses any chain whose
name does not start with ``ORDEAL-``.

The binary is the ``iptables`` found on PATH (on these machines the nf_tables
backend, 1.8.9); every call passes ``-w`` so concurrent callers wait for the
lock instead of failing. Rule building and output parsing are pure functions
(unit-tested without root); only ``run`` and the functions that call it touch
the kernel.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ordeal.containers import container_pid
from ordeal.topology import Endpoint, Node

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry
from .safety import require_ours, require_running

CHAIN_PREFIX = "ORDEAL-"
#: iptables limits chain names to 28 characters (XT_EXTENSION_MAXNAMELEN - 1).
MAX_CHAIN_LEN = 28
#: The hooks a chain may be jumped to from (filter table).
HOOKS = ("INPUT", "OUTPUT")
RUN_TIMEOUT_S = 60.0
_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_COUNTER_RE = re.compile(r" -c (\d+) (\d+)")


class IptablesError(RuntimeError):
    """An iptables command failed after the fault started acting. Carries the
    command and iptables' own message; the fault heals what it had done."""


@dataclass(frozen=True)
class ChainSpec:
    """One suite chain: its rules (argv after ``-A <chain>``) and the hooks
    that jump to it, each jump labelled with ``comment``."""

    name: str
    comment: str
    rules: tuple[tuple[str, ...], ...]
    hooks: tuple[str, ...] = HOOKS


@dataclass(frozen=True)
class RuleCounter:
    """One rule of a chain and how many packets and bytes it matched."""

    rule: str
    packets: int
    bytes: int


@dataclass
class ChainInfo:
    """An ORDEAL chain as ``iptables -S`` shows it, with the jumps to it."""

    name: str
    jump_hooks: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- pure parts

def chain_name(fault_id: str) -> str:
    """``ORDEAL-<fault id>``; refuses ids iptables would reject or truncate."""
    if not _ID_RE.match(fault_id):
        raise ValueError(f"fault id {fault_id!r}: only letters, digits, '-' and '_' may "
                         "appear in an iptables chain name")
    name = CHAIN_PREFIX + fault_id
    if len(name) > MAX_CHAIN_LEN:
        raise ValueError(f"chain name {name!r} is {len(name)} characters; iptables allows "
                         f"{MAX_CHAIN_LEN}. Use a fault id of at most "
                         f"{MAX_CHAIN_LEN - len(CHAIN_PREFIX)} characters")
    return name


def comment_for(run_id: str, fault_id: str) -> str:
    """The label on every jump: which run and which fault put it there."""
    return f"ordeal:{run_id}:{fault_id}"


def jump_rule(hook: str, chain: str, comment: str) -> list[str]:
    """Arguments that insert the jump to ``chain`` first in ``hook``, so the
    suite's rules act before any ACCEPT someone else placed there."""
    if hook not in HOOKS:
        raise ValueError(f"hook {hook!r}: the suite jumps only from {HOOKS}")
    return ["-I", hook, "1", "-m", "comment", "--comment", comment, "-j", chain]


def create_commands(spec: ChainSpec) -> list[list[str]]:
    """The iptables argv lists (without the binary) that build ``spec``:
    the chain, its rules, then the jumps (the moment it takes effect)."""
    cmds = [["-N", spec.name]]
    cmds += [["-A", spec.name, *rule] for rule in spec.rules]
    cmds += [jump_rule(hook, spec.name, spec.comment) for hook in spec.hooks]
    return cmds


def parse_chains(listing: str) -> list[ChainInfo]:
    """ORDEAL chains and the jumps to them, from ``iptables -S`` output."""
    chains: dict[str, ChainInfo] = {}
    for line in listing.splitlines():
        tokens = shlex.split(line)
        if len(tokens) == 2 and tokens[0] == "-N" and tokens[1].startswith(CHAIN_PREFIX):
            chains.setdefault(tokens[1], ChainInfo(tokens[1]))
    for line in listing.splitlines():
        tokens = shlex.split(line)
        if len(tokens) >= 4 and tokens[0] == "-A" and tokens[-2] == "-j" \
                and tokens[-1] in chains:
            info = chains[tokens[-1]]
            info.jump_hooks.append(tokens[1])
            if "--comment" in tokens:
                info.comments.append(tokens[tokens.index("--comment") + 1])
    return list(chains.values())


def jumps_to(listing: str, chain: str) -> list[list[str]]:
    """The ``-A`` rules of a hook listing that jump to ``chain``, as argv."""
    out = []
    for line in listing.splitlines():
        tokens = shlex.split(line)
        if len(tokens) >= 4 and tokens[0] == "-A" and tokens[-2:] == ["-j", chain]:
            out.append(tokens)
    return out


def parse_counters(listing: str, chain: str) -> list[RuleCounter]:
    """Per-rule counters from ``iptables -v -S <chain>`` (``-c PKTS BYTES``)."""
    out = []
    for line in listing.splitlines():
        if not line.startswith(f"-A {chain} "):
            continue
        m = _COUNTER_RE.search(line)
        if not m:
            raise IptablesError(f"no counters in iptables line {line!r}; expected '-c N N' "
                                "from 'iptables -v -S'")
        rule = (line[:m.start()] + line[m.end():])[len(f"-A {chain} "):]
        out.append(RuleCounter(rule, int(m.group(1)), int(m.group(2))))
    return out


# ------------------------------------------------------------ kernel parts

def binary() -> str:
    """The iptables on PATH; FaultError (nothing changed) when it cannot act."""
    path = shutil.which("iptables")
    if path is None:
        raise FaultError("iptables is not on PATH: install it (apt-get install iptables) and "
                         "run as root; kernel network faults need it")
    if os.geteuid() != 0:
        raise FaultError(f"iptables needs root (this process runs as uid {os.geteuid()}): "
                         "run the suite as root, or use the fault proxy's link faults")
    return path


def run(args: Sequence[str], check: bool = True,
        netns: int | None = None) -> subprocess.CompletedProcess[str]:
    """One iptables call (``-w``: wait for the lock, never fail on it); with
    ``netns`` (a pid), in that process's network namespace, entered from the
    host with nsenter, so a container needs no capability for it."""
    cmd = [binary(), "-w", *args]
    if netns is not None:
        cmd = ["nsenter", "-t", str(netns), "-n", *cmd]
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise IptablesError(f"{shlex.join(cmd)} did not finish in {RUN_TIMEOUT_S:.0f} s: the "
                            "xtables lock is held or the machine is overloaded; retry, or "
                            "heal later with python -m faults heal-all") from None
    if check and done.returncode != 0:
        raise IptablesError(f"{shlex.join(cmd)} failed with code {done.returncode}: "
                            f"{done.stderr.strip() or done.stdout.strip()}")
    return done


def require_usable(netns: int | None = None) -> None:
    """Present, root, and able to read the filter table (a container without
    NET_ADMIN fails here): raise FaultError before anything is changed."""
    try:
        run(["-S", "INPUT"], netns=netns)
    except IptablesError as e:
        raise FaultError(f"iptables cannot read the filter table ({e}); kernel network faults "
                         "need root with CAP_NET_ADMIN") from None


def unavailable_reason() -> str | None:
    """Why kernel network faults cannot run here, or None when they can."""
    try:
        require_usable()
    except FaultError as e:
        return str(e)
    return None


def list_chains(netns: int | None = None) -> list[ChainInfo]:
    """Every ORDEAL chain in the filter table, with the jumps to it."""
    return parse_chains(run(["-S"], netns=netns).stdout)


def chain_exists(name: str, netns: int | None = None) -> bool:
    return any(c.name == name for c in list_chains(netns))


def create_chain(spec: ChainSpec, netns: int | None = None) -> None:
    """Build ``spec``. If any step fails, what was built is removed and the
    error is raised: a half-built chain is never left behind."""
    if not spec.name.startswith(CHAIN_PREFIX) or len(spec.name) > MAX_CHAIN_LEN:
        raise ValueError(f"chain {spec.name!r}: suite chains are named {CHAIN_PREFIX}<id>, "
                         f"at most {MAX_CHAIN_LEN} characters")
    if chain_exists(spec.name, netns):
        raise IptablesError(f"chain {spec.name} already exists; a fault id is used once. "
                            "Heal the old fault first (python -m faults heal-all)")
    try:
        for args in create_commands(spec):
            run(args, netns=netns)
    except BaseException as e:
        try:
            remove_chain(spec.name, netns)
        except Exception as cleanup:  # noqa: BLE001 - keep the first error, note the second
            e.add_note(f"removing the half-built chain failed too: {cleanup}; "
                       "run python -m faults heal-all")
        raise


def remove_chain(name: str, netns: int | None = None) -> dict[str, object]:
    """Remove the jumps to ``name`` from every hook, then the chain itself.
    Idempotent: an absent chain or jump is fine. Refuses non-suite chains."""
    if not name.startswith(CHAIN_PREFIX):
        raise ValueError(f"refusing to remove chain {name!r}: the suite removes only its own "
                         f"{CHAIN_PREFIX}* chains")
    removed_jumps = 0
    for hook in HOOKS:
        for tokens in jumps_to(run(["-S", hook], netns=netns).stdout, name):
            run(["-D", *tokens[1:]], netns=netns)
            removed_jumps += 1
    existed = chain_exists(name, netns)
    if existed:
        run(["-F", name], netns=netns)
        run(["-X", name], netns=netns)
    return {"chain": name, "existed": existed, "jumps_removed": removed_jumps}


def counters(name: str, netns: int | None = None) -> list[RuleCounter]:
    """Packet and byte counters of each rule of chain ``name``, in order."""
    return parse_counters(run(["-v", "-S", name], netns=netns).stdout, name)


# ------------------------------------------------- faults made of one chain

def ipv4_host(endpoint: Endpoint, kind: str) -> str:
    """The endpoint's address as iptables (IPv4) takes it; refuses addresses
    the suite does not own and IPv6 (ip6tables is not wired up yet)."""
    require_ours(endpoint, kind)
    host = "127.0.0.1" if endpoint.host == "localhost" else endpoint.host
    if ipaddress.ip_address(host).version != 4:
        raise FaultError(f"{kind}: {endpoint.host}:{endpoint.port} is IPv6; kernel network "
                         "faults use iptables (IPv4) only so far. Start the node on 127.0.0.1")
    return host


def as_nodes(target: Node | Sequence[Node], kind: str) -> list[Node]:
    """One node or several, as a non-empty list without duplicates."""
    nodes = list(target) if isinstance(target, (list, tuple)) else [target]
    if not nodes:
        raise FaultError(f"{kind}: no node given; pass a Node or a list of nodes")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise FaultError(f"{kind}: node names {names} repeat; name each node once")
    return nodes


def netns_of(node: Node) -> tuple[str | None, int | None]:
    """(container id, a pid in its network namespace) for a node in a
    container; (None, None) for a node on the host's network."""
    container = getattr(node, "container_id", None)
    if container is None:
        return None, None
    pid = node.netns_pid()  # type: ignore[attr-defined]
    if pid is None:
        raise FaultError(f"{node.name}: container {container[:12]} is not running; its network "
                         "namespace cannot be entered")
    return container, pid


class ChainFault(Fault):
    """A fault that is exactly one ORDEAL chain on the nodes' ports.

    Subclasses say which rules (``_rules``) and from which hooks. The chain
    is named for the ledger entry's id, so heal needs nothing but the entry:
    ``undo`` removes ``ORDEAL-<entry id>`` and the jumps to it, in a live
    run and after a crash alike.

    Nodes on the host's network get the chain in the host's filter table;
    a node in a container gets it in the container's network namespace
    (entered with nsenter), with only that node's rules. The ledger entry
    says whether the host has one and names the containers, so the heal
    finds every place again.
    """

    hooks: tuple[str, ...] = HOOKS
    capabilities = ("CAP_NET_ADMIN",)
    tools = ("iptables",)

    def __init__(self, target: Node | Sequence[Node], run_id: str, ledger: Ledger):
        self.nodes = as_nodes(target, self.kind)
        super().__init__(",".join(n.name for n in self.nodes), run_id, ledger)

    def _rules(self) -> list[tuple[str, ...]]:
        raise NotImplementedError

    def _rules_for(self, nodes: list[Node]) -> list[tuple[str, ...]]:
        """The rules for some of the nodes; subclasses whose rules are made
        per endpoint list need not override it."""
        keep, self.nodes = self.nodes, nodes
        try:
            return self._rules()
        finally:
            self.nodes = keep

    def _places(self) -> list[tuple[str | None, int | None, list[Node]]]:
        """Where chains go: (container, netns pid, nodes), host first."""
        groups: dict[str | None, tuple[int | None, list[Node]]] = {}
        for node in self.nodes:
            container, pid = netns_of(node)
            groups.setdefault(container, (pid, []))[1].append(node)
        return [(c, pid, nodes) for c, (pid, nodes) in groups.items()]

    def _preflight(self) -> None:
        for node in self.nodes:
            ipv4_host(node.endpoint, self.kind)
            require_running(node, self.kind)
        self._rules()  # parameters are checked here, before anything changes
        for _, pid, _ in self._places():
            require_usable(pid)

    @property
    def chain(self) -> str:
        if self.entry is None:
            raise RuntimeError(f"{self.kind} on {self.target} is not injected: no chain")
        return chain_name(self.entry.id)

    def _inverse(self) -> dict[str, Any]:
        # The chain's name comes from the entry id (not known yet here); the
        # rules are kept for people reading the ledger.
        places = [c for c, _, _ in self._places()]
        return {"action": "remove_chain", "chain": f"{CHAIN_PREFIX}<fault id>",
                "hooks": list(self.hooks), "rules": [list(r) for r in self._rules()],
                "host": None in places, "containers": [c for c in places if c is not None]}

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None
        made: list[int | None] = []
        try:
            for _, pid, nodes in self._places():
                spec = ChainSpec(self.chain, comment_for(self.run_id, self.entry.id),
                                 tuple(self._rules_for(nodes)), self.hooks)
                create_chain(spec, pid)
                made.append(pid)
        except BaseException:
            for pid in made:  # all places or none: never half a partition
                remove_chain(self.chain, pid)
            raise
        return {"chain": self.chain, "hooks": list(self.hooks),
                "ports": [n.endpoint.port for n in self.nodes],
                "netns": [pid for pid in made if pid is not None]}

    @staticmethod
    def entry_places(entry: LedgerEntry) -> tuple[dict[str, int | None], list[str]]:
        """Where the entry's chain may be: ({"host" or "container ID": netns
        pid}, containers gone). A container that no longer runs is gone, and
        with its network namespace the chain in it. (Entries written before
        ``host`` was kept always had a chain in the host's table.)"""
        places: dict[str, int | None] = {"host": None} if entry.inverse.get("host", True) else {}
        gone = []
        for container in entry.inverse.get("containers", []):
            pid = container_pid(container)
            if pid is None:
                gone.append(container[:12])
            else:
                places[f"container {container[:12]}"] = pid
        return places, gone

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        chain = chain_name(entry.id)
        places, gone = cls.entry_places(entry)
        done: dict[str, Any] = {"chain": chain, "existed": False, "jumps_removed": 0,
                                "places": {}}
        for place, pid in places.items():
            one = remove_chain(chain, pid)
            done["places"][place] = one["existed"]
            done["existed"] = bool(done["existed"] or one["existed"])
            done["jumps_removed"] += one["jumps_removed"]
        if gone:
            done["containers_gone"] = gone
        return done

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        what = [f"{'removed' if existed else 'found no'} chain {done['chain']} in the {place}"
                for place, existed in done["places"].items()]
        what += [f"container {c} is gone, and its rules with it"
                 for c in done.get("containers_gone", [])]
        return (f"{healed(entry)}: {'; '.join(what) or 'nothing left to remove'} "
                f"({done['jumps_removed']} jump(s) removed)")

    def place_counters(self) -> list[list[RuleCounter]]:
        """Per place (host, each container): its chain's rules and what they
        matched so far."""
        return [counters(self.chain, pid) for _, pid, _ in self._places()]

    def counters(self) -> list[RuleCounter]:
        """This fault's rules and what they matched so far (every place)."""
        return [c for place in self.place_counters() for c in place]

    def observe(self) -> Effect:
        """Packets the rules that act (``-j DROP``/``REJECT``) matched: a
        partition of a port nobody uses matches none, and has done nothing."""
        acting = [c for c in self.counters() if "-j" in c.rule.split()]
        matched = sum(c.packets for c in acting)
        return Effect(matched > 0, "the packet counters of the chain's dropping or rejecting "
                      "rules (iptables -v)",
                      {"packets_matched": matched, "rules": len(acting), "chain": self.chain})
