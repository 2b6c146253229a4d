"""The target file: a deployment Ordeal did not start (``--cluster external
--target FILE.toml``), in the words every layer shares.

A user's cluster (a Kubernetes deployment, a docker-compose file, a fleet
of hosts) is reached, never started or stopped: the file names where
clients connect, optionally each replica, and the commands ("hooks") that
act on its nodes for each fault kind, since Ordeal cannot signal processes
it does not own. Read once at start; every mistake is a ``ConfigError``
that names the file, the key and what to write instead, before a byte is
sent.

The API key is named, never given: ``api_key_env`` is the name of an
environment variable read when requests are made, so the key itself is in
no file Ordeal reads or writes. ``describe()`` (what summary.json records)
shows the variable's name and whether it was set, never its value.

Reference (docs/external.md, "The target file")::

    name = "staging"                      # labels the runs (default: the file's stem)
    engine = "vllm"                       # the replicas' engine (only vllm for now)
    model = "my-model"                    # the served model name clients send
    entrypoint = "http://10.0.0.10:8000"  # router or gateway (scheme, host, port)
    entrypoint_health_path = "/health"    # what says the entrypoint serves
    api_key_env = "ORDEAL_TARGET_API_KEY" # bearer token's variable (optional)
    headers = { "x-tenant" = "qa" }       # extra request headers (optional)
    fault_proxy = true                    # Ordeal's proxy in front of the entrypoint
    ready_timeout_s = 300                 # how long a node may take to serve again
    trusted_without_evidence = ["http_fault"]  # kinds whose windows pass unobserved (optional)
    hook_env = ["KUBECONFIG"]             # variables the hooks get besides PATH, HOME, LANG
    replica_header = "x-served-by"        # response header naming the replica (optional)
    [tls]                                 # https entrypoints
    verify = true
    ca_file = "/path/ca.pem"
    [[replica]]                           # optional, one per replica
    name = "replica-0"
    url = "http://10.0.0.11:8000"
    health_path = "/health"
    metrics_path = "/metrics"
    served_as = ["10.0.0.11:8000"]        # replica_header values that mean this replica
    [toxiproxy]                           # a Toxiproxy server of the user's (optional)
    url = "http://10.0.0.12:8474"
    links = { "router-replica-0" = "vllm-0" }  # link -> its Toxiproxy proxy
    [[hook]]                              # one per fault kind and node ("*": every replica)
    kind = "process_kill"
    node = "replica-0"
    inject = "kubectl -n llm delete pod vllm-0 --wait=false"
    heal = "kubectl -n llm rollout status deploy/vllm --timeout=300s"
    timeout_s = 60
"""

from __future__ import annotations

import hashlib
import re
import shlex
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import kinds as kind_traits
from .config import ConfigError, read_input, redact_command, redact_env

ENGINES = ("vllm",)
#: A node name, matched whole (``fullmatch``: a ``$`` alone lets a trailing
#: newline through, and the name reaches a hook's shell command).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOP = {"name", "engine", "model", "entrypoint", "entrypoint_health_path", "api_key_env",
        "headers", "fault_proxy", "ready_timeout_s", "tls", "replica", "hook", "toxiproxy",
        "trusted_without_evidence", "hook_env", "replica_header"}
#: An HTTP header name (RFC 9110 token).
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")


def trustable_kinds() -> tuple[str, ...]:
    """The kinds ``trusted_without_evidence`` may name: those that can act
    on an external deployment (a hook's node kinds, the proxies' link
    kinds)."""
    return tuple(sorted({*kind_traits.hook_kinds(), *kind_traits.link_kinds()}))


@dataclass(frozen=True)
class TargetURL:
    """A URL of the deployment: scheme, host and port (no path: requests
    go to the OpenAI paths under it)."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True)
class ReplicaTarget:
    name: str
    url: TargetURL
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    #: Values of the target's ``replica_header`` that mean this replica,
    #: besides its name and its URL's ``host:port``.
    served_as: tuple[str, ...] = ()

    def header_values(self) -> tuple[str, ...]:
        """Every value of ``replica_header`` that names this replica."""
        host = f"[{self.url.host}]" if ":" in self.url.host else self.url.host
        return tuple(dict.fromkeys((self.name, f"{host}:{self.url.port}", *self.served_as)))


@dataclass(frozen=True)
class Hook:
    """The user's commands for one fault kind on one node: ``inject`` breaks
    it, ``heal`` repairs it (run by the live heal and by heal-all after a
    crash, so it must be safe to run twice). Run with ``bash -c``; see
    faults/hook.py for the environment they get."""

    kind: str
    node: str  # a node name, or "*" for every replica
    inject: str
    heal: str
    timeout_s: float = 60.0

    def to_dict(self) -> dict[str, Any]:
        """The hook as summary.json records it: its commands redacted."""
        return {"kind": self.kind, "node": self.node, "inject": redact_command(self.inject),
                "heal": redact_command(self.heal), "timeout_s": self.timeout_s}


def hook_command(template: str, node: str) -> str:
    """A hook's command for ``node``: ``{node}`` replaced by the name, quoted
    for the shell (a name is checked at read time, and quoted all the same:
    it reaches ``bash -c``)."""
    return template.replace("{node}", shlex.quote(node))


def file_sha256(path: str | Path) -> str | None:
    """The sha256 of a file's bytes; None when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class TLS:
    verify: bool = True
    ca_file: str | None = None


@dataclass(frozen=True)
class ToxiproxyTarget:
    """A Toxiproxy server the user runs in front of parts of the deployment:
    its API URL, and which of its proxies is which link (``client-router``,
    ``router-<replica>``)."""

    url: TargetURL
    links: tuple[tuple[str, str], ...]  # (link name, Toxiproxy proxy name)


@dataclass(frozen=True)
class TargetSpec:
    path: Path
    name: str
    engine: str
    model: str
    entrypoint: TargetURL
    api_key_env: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    fault_proxy: bool = True
    ready_timeout_s: float = 300.0
    tls: TLS = field(default_factory=TLS)
    replicas: tuple[ReplicaTarget, ...] = ()
    hooks: tuple[Hook, ...] = ()
    toxiproxy: ToxiproxyTarget | None = None
    entrypoint_health_path: str = "/health"
    #: Fault kinds whose windows count as effective without evidence (a hook
    #: or a Toxiproxy link Ordeal cannot observe): the user vouches for them,
    #: fault_effective lists those windows. Any other window without evidence
    #: makes fault_effective "unknown".
    trusted_without_evidence: tuple[str, ...] = ()
    #: The harness's environment variables the hooks get, by name, besides
    #: PATH, HOME, LANG and Ordeal's labels (faults/hook.py): a hook gets no
    #: other variable of the harness, so no secret it did not ask for.
    hook_env: tuple[str, ...] = ()
    #: The sha256 of the file's bytes as read: the ledger entry of a hook's
    #: fault records it, and heal-all says when the file changed since.
    sha256: str = ""
    #: The response header in which the deployment names the replica that
    #: answered (a gateway's ``x-served-by``, say): failover and fault_slo
    #: are then judged; without it they are "unknown" (clusters/external.py).
    replica_header: str | None = None

    def node_names(self) -> tuple[tuple[str, str], ...]:
        """``replica_header`` value -> replica name (load.client.ClientOptions)."""
        return tuple((v, r.name) for r in self.replicas for v in r.header_values())

    def hook(self, kind: str, node: str) -> Hook | None:
        """The hook for ``kind`` on ``node``: the node's own, else the
        ``"*"`` one for a replica."""
        own = [h for h in self.hooks if h.kind == kind and h.node == node]
        if own:
            return own[0]
        if node in {r.name for r in self.replicas}:
            return next((h for h in self.hooks if h.kind == kind and h.node == "*"), None)
        return None

    def unsupported(self, kind: str) -> str | None:
        """Why ``kind`` cannot act on this deployment, or None: a link kind
        needs Ordeal's fault proxy (or, L4 only, a [toxiproxy] link), a node
        kind a hook. Said at start, in ``python -m faults catalogue --target``
        and by the fault factory."""
        l4 = kind_traits.l4_link_kinds()
        if kind in kind_traits.link_kinds():
            if (kind not in l4 and self.fault_proxy
                    and self.entrypoint.scheme == "https"):
                return ("acts on HTTP and SSE (L7), and the entrypoint speaks TLS: the fault "
                        "proxy sees only encrypted bytes there")
            if self.fault_proxy or (kind in l4 and self.toxiproxy is not None):
                return None
            if self.toxiproxy is not None:
                return ("acts on HTTP and SSE (L7), which only Ordeal's fault proxy reads, and "
                        "the target file sets fault_proxy = false (its [toxiproxy] links are "
                        "L4 only)")
            return ("acts through Ordeal's fault proxy in front of the entrypoint or a "
                    "[toxiproxy] link, and the target file sets fault_proxy = false and gives "
                    "none")
        if kind not in kind_traits.hook_kinds():
            return f"has no way to act on an external deployment ({kind})"
        if not any(h.kind == kind for h in self.hooks):
            return (f"acts on the deployment's own processes or machines, which Ordeal does "
                    f"not own: give a [[hook]] with kind = \"{kind}\" in {self.path}")
        return None

    def hosts(self) -> set[str]:
        """Every host name or address the file names (what --allow-target
        may allow)."""
        return {self.entrypoint.host, *(r.url.host for r in self.replicas),
                *([self.toxiproxy.url.host] if self.toxiproxy else [])}

    def describe(self) -> dict[str, Any]:
        """The target as summary.json records it: no secret, ever (the API
        key's variable is named; header values of secret-looking names are
        hidden)."""
        return {"file": str(self.path), "name": self.name, "engine": self.engine,
                "model": self.model, "entrypoint": self.entrypoint.url,
                "entrypoint_health_path": self.entrypoint_health_path,
                "api_key_env": self.api_key_env, "headers": redact_env(self.headers),
                "fault_proxy": self.fault_proxy, "ready_timeout_s": self.ready_timeout_s,
                "tls": {"verify": self.tls.verify, "ca_file": self.tls.ca_file},
                "replicas": [{"name": r.name, "url": r.url.url, "health_path": r.health_path,
                              "metrics_path": r.metrics_path} for r in self.replicas],
                "hooks": [h.to_dict() for h in self.hooks],
                "hook_env": list(self.hook_env), "sha256": self.sha256,
                "toxiproxy": None if self.toxiproxy is None else {
                    "url": self.toxiproxy.url.url, "links": dict(self.toxiproxy.links)},
                "trusted_without_evidence": list(self.trusted_without_evidence),
                "replica_header": self.replica_header,
                "served_as": {r.name: list(r.served_as) for r in self.replicas if r.served_as}}


def _fail(path: Path, where: str, what: str) -> ConfigError:
    return ConfigError(f"--target {path}: {where}: {what}")


def parse_url(path: Path, where: str, text: Any) -> TargetURL:
    if not isinstance(text, str) or not text:
        raise _fail(path, where, "give a URL such as \"http://10.0.0.10:8000\"")
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise _fail(path, where, f"{text!r} is not an http(s) URL with a host; write e.g. "
                                 "\"http://10.0.0.10:8000\"")
    if u.path not in ("", "/") or u.query or u.fragment or u.username or u.password:
        raise _fail(path, where, f"{text!r}: give scheme, host and port only (requests go to "
                                 "/v1/... under it; credentials belong in api_key_env)")
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError as e:
        raise _fail(path, where, f"{text!r}: bad port ({e})") from None
    return TargetURL(u.scheme, u.hostname, port)


def _str(path: Path, where: str, value: Any, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, where, "give a non-empty string")
    return value


def _table_keys(path: Path, where: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(path, where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def read_target_file(path: str | Path) -> TargetSpec:
    """The target file at ``path``, checked whole; ``ConfigError`` with the
    key and the fix for any mistake."""
    p = Path(path)
    raw = read_input(p, f"--target {p}", "give the path of a target file (docs/external.md"
                                         ", \"The target file\")")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--target {p}: not valid TOML ({e})") from None
    _table_keys(p, "the top level", data, _TOP)
    for key in ("entrypoint", "model"):
        if key not in data:
            raise _fail(p, key, "missing; the file must name the entrypoint URL and the "
                                "served model name")
    engine = _str(p, "engine", data.get("engine"), "vllm")
    if engine not in ENGINES:
        raise _fail(p, "engine", f"{engine!r}: external targets run {', '.join(ENGINES)} only")
    api_key_env = data.get("api_key_env")
    if api_key_env is not None and (not isinstance(api_key_env, str)
                                    or not _ENV_NAME.fullmatch(api_key_env)):
        raise _fail(p, "api_key_env", "give the NAME of an environment variable holding the "
                                      "key (the key itself never goes in a file)")
    headers = data.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise _fail(p, "headers", "give a table of header names to string values, e.g. "
                                  "headers = { \"x-tenant\" = \"qa\" }")
    if any(k.lower() == "authorization" for k in headers):
        raise _fail(p, "headers", "no Authorization header here (it would be a secret in a "
                                  "file); name the key's variable in api_key_env")
    fault_proxy = data.get("fault_proxy", True)
    if not isinstance(fault_proxy, bool):
        raise _fail(p, "fault_proxy", "give true or false")
    ready = data.get("ready_timeout_s", 300.0)
    if isinstance(ready, bool) or not isinstance(ready, (int, float)) or ready <= 0:
        raise _fail(p, "ready_timeout_s", "give seconds above zero")
    tls_t = data.get("tls", {})
    if not isinstance(tls_t, dict):
        raise _fail(p, "tls", "give a table: [tls] verify = true, ca_file = \"...\"")
    _table_keys(p, "[tls]", tls_t, {"verify", "ca_file"})
    if not isinstance(tls_t.get("verify", True), bool):
        raise _fail(p, "tls.verify", "give true or false")
    ca = tls_t.get("ca_file")
    if ca is not None:
        ca = str((p.parent / _str(p, "tls.ca_file", ca)).resolve())
        if not Path(ca).is_file():
            raise _fail(p, "tls.ca_file", f"{ca}: no such file")
    replicas = []
    for i, r in enumerate(data.get("replica", [])):
        where = f"[[replica]] #{i + 1}"
        if not isinstance(r, dict):
            raise _fail(p, where, "give a table with name and url")
        _table_keys(p, where, r, {"name", "url", "health_path", "metrics_path", "served_as"})
        name = _str(p, f"{where} name", r.get("name"))
        if not _NAME.fullmatch(name) or name == "router":
            raise _fail(p, f"{where} name", f"{name!r}: use letters, digits, '-', '_', '.' "
                                            "(and not 'router', the entrypoint's name)")
        paths = {k: _str(p, f"{where} {k}", r.get(k), d)
                 for k, d in (("health_path", "/health"), ("metrics_path", "/metrics"))}
        for k, v in paths.items():
            if not v.startswith("/"):
                raise _fail(p, f"{where} {k}", f"{v!r}: a path begins with /")
        served_as = r.get("served_as", [])
        if isinstance(served_as, str):
            served_as = [served_as]
        if not isinstance(served_as, list) or not all(
                isinstance(v, str) and v.strip() == v and v for v in served_as):
            raise _fail(p, f"{where} served_as", "give the replica_header values that mean "
                                                 "this replica, e.g. served_as = "
                                                 "[\"10.0.0.11:8000\"]")
        replicas.append(ReplicaTarget(name, parse_url(p, f"{where} url", r.get("url")),
                                      **paths, served_as=tuple(served_as)))
    names = [r.name for r in replicas]
    if len(set(names)) != len(names):
        raise _fail(p, "[[replica]]", f"names repeat: {names}")
    replica_header = _replica_header(p, data.get("replica_header"), replicas)
    hooks = []
    for i, h in enumerate(data.get("hook", [])):
        where = f"[[hook]] #{i + 1}"
        if not isinstance(h, dict):
            raise _fail(p, where, "give a table with kind, node, inject and heal")
        _table_keys(p, where, h, {"kind", "node", "inject", "heal", "timeout_s"})
        kind = _str(p, f"{where} kind", h.get("kind"))
        hookable = kind_traits.hook_kinds()  # node kinds (KindTraits.hookable)
        if kind not in hookable:
            raise _fail(p, f"{where} kind", f"{kind!r}: hooks act for {', '.join(hookable)}"
                                            " (link faults act through the fault proxy)")
        node = _str(p, f"{where} node", h.get("node"))
        if node not in ("*", "router", *names):
            raise _fail(p, f"{where} node", f"{node!r}: name a [[replica]], \"router\" (the "
                                            "entrypoint) or \"*\" (every replica)")
        timeout = h.get("timeout_s", 60.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise _fail(p, f"{where} timeout_s", "give seconds above zero")
        hooks.append(Hook(kind, node, _str(p, f"{where} inject", h.get("inject")),
                          _str(p, f"{where} heal", h.get("heal")), float(timeout)))
    seen = [(h.kind, h.node) for h in hooks]
    if len(set(seen)) != len(seen):
        raise _fail(p, "[[hook]]", "two hooks for the same kind and node; keep one")
    toxiproxy = _toxiproxy(p, data.get("toxiproxy"), names, fault_proxy)
    entry_health = _str(p, "entrypoint_health_path", data.get("entrypoint_health_path"),
                        "/health")
    if not entry_health.startswith("/"):
        raise _fail(p, "entrypoint_health_path", f"{entry_health!r}: a path begins with /")
    trusted = _trusted_kinds(p, data.get("trusted_without_evidence", []))
    hook_env = data.get("hook_env", [])
    if not isinstance(hook_env, list) or not all(
            isinstance(k, str) and _ENV_NAME.fullmatch(k) for k in hook_env):
        raise _fail(p, "hook_env", "give a list of environment variable names the hooks "
                                   "need, e.g. hook_env = [\"KUBECONFIG\"]")
    return TargetSpec(p.resolve(), _str(p, "name", data.get("name"), p.stem),
                      engine, _str(p, "model", data["model"]),
                      parse_url(p, "entrypoint", data["entrypoint"]), api_key_env,
                      tuple(headers.items()), fault_proxy, float(ready),
                      TLS(tls_t.get("verify", True), ca), tuple(replicas), tuple(hooks),
                      toxiproxy, entry_health, trusted,
                      hook_env=tuple(dict.fromkeys(hook_env)),
                      sha256=hashlib.sha256(raw).hexdigest(), replica_header=replica_header)


def _replica_header(p: Path, value: Any, replicas: list[ReplicaTarget]) -> str | None:
    """``replica_header = "x-served-by"``: a header name, with the replicas
    named (their values must say which one answered) and no value claimed
    by two of them."""
    if value is None:
        return None
    if not isinstance(value, str) or not _HEADER.fullmatch(value):
        raise _fail(p, "replica_header", f"{value!r}: give the name of the response header "
                                         "that names the replica, e.g. \"x-served-by\"")
    if not replicas:
        raise _fail(p, "replica_header", "name the replicas ([[replica]] with name and url; "
                                         "served_as for other values) so that a value of "
                                         f"{value} can be placed on one")
    owners: dict[str, str] = {}
    for r in replicas:
        for v in r.header_values():
            if owners.setdefault(v, r.name) != r.name:
                raise _fail(p, "served_as", f"{v!r} names both {owners[v]} and {r.name}; "
                                            "give each value to one replica")
    return value.lower()


def _trusted_kinds(p: Path, value: Any) -> tuple[str, ...]:
    """``trusted_without_evidence = ["KIND", ...]``: fault kinds of this
    file's faults, each named once."""
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise _fail(p, "trusted_without_evidence", "give a list of fault kinds, e.g. "
                                                   "trusted_without_evidence = [\"http_fault\"]")
    trustable = trustable_kinds()
    unknown = sorted({k for k in value if k not in trustable})
    if unknown:
        raise _fail(p, "trusted_without_evidence",
                    f"unknown fault kind(s) {unknown}; name kinds that act on an external "
                    f"deployment: {', '.join(trustable)}")
    return tuple(dict.fromkeys(value))


def _toxiproxy(p: Path, table: Any, replicas: list[str],
               fault_proxy: bool) -> ToxiproxyTarget | None:
    """``[toxiproxy]``: url, and links = { LINK = "PROXY", ... }."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise _fail(p, "[toxiproxy]", "give a table: url = \"http://HOST:8474\", links = { "
                                      "\"router-replica-0\" = \"its proxy's name\" }")
    _table_keys(p, "[toxiproxy]", table, {"url", "links"})
    url = parse_url(p, "toxiproxy.url", table.get("url"))
    links = table.get("links")
    if not isinstance(links, dict) or not links or not all(
            isinstance(v, str) and v for v in links.values()):
        raise _fail(p, "toxiproxy.links", "give a table of link names to the names of the "
                                          "Toxiproxy proxies that carry them")
    allowed = {"client-router", *(f"router-{r}" for r in replicas)}
    for link in links:
        if link not in allowed:
            raise _fail(p, "toxiproxy.links", f"{link!r}: name client-router or router-<a "
                                              f"[[replica]] name> ({sorted(allowed)})")
    if "client-router" in links and fault_proxy:
        raise _fail(p, "toxiproxy.links", "client-router is Ordeal's fault proxy's link "
                                          "while fault_proxy = true; set fault_proxy = false "
                                          "to use your Toxiproxy there")
    return ToxiproxyTarget(url, tuple(links.items()))
