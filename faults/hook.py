"""A fault that acts through the user's own commands: the hooks of a target
file (``--cluster external``, ordeal/target.py), for nodes Ordeal did not
start and cannot signal (a Kubernetes pod, a host of a fleet).

The inject hook breaks the node (``kubectl delete pod``, ``kill -STOP``, a
NetworkPolicy), the heal hook repairs it. As with every kind, the ledger
entry is written before the inject hook runs and carries the heal hook
whole (command, timeout, environment), so ``python -m faults heal-all``
runs the same heal after a SIGKILLed harness (``HookFault.undo``, the one
inverse). A heal hook must therefore be safe to run twice, and when the
inject hook did nothing.

A hook runs with ``bash -c`` in a session of its own and with job control
on, so a process it starts in the background outlives it (``cmd &``,
``nohup cmd &``, ``setsid cmd &``, ``setsid -f cmd``; ``systemd-run`` and
``docker start`` start nothing of the hook's); what is still in the hook's
own process group two seconds after bash exited is ended, and its whole
session when it outlives ``timeout_s``. Each process ended is recorded
(pid, command line, why) with the hook's command, exit code, seconds and
output, in the fault's record, whether the hook failed or not. Its environment is
small on purpose (the harness's holds the API key, and maybe other
secrets): ``PATH``, ``HOME`` and ``LANG`` of the harness's, the variables
the target file names in ``hook_env``, and ``ORDEAL_NODE``,
``ORDEAL_NODE_URL``, ``ORDEAL_KIND``, ``ORDEAL_RUN_ID``, ``ORDEAL_FAULT_ID``
and ``ORDEAL_PARAM_<NAME>`` for each parameter of the fault. ``{node}`` in
the command is replaced by the node's name, shell-quoted. Its output
(stdout and stderr, the last 4000 characters, undecodable bytes replaced)
is recorded in the entry and the history, with the value of every
secret-looking variable (``ordeal.config.SECRET_ENV``: KEY, TOKEN, SECRET,
PASSWORD, CREDENTIAL, AUTH ...) and of the API key's scrubbed should a hook
print it; its command is recorded redacted (``redact_command``). A hook
that exits non-zero, hangs past its timeout or cannot start is a
``FaultError`` that says which hook, its exit and its output; an inject
that fails is healed at once, as every half-done inject is.

The ledger entry names the target file the hook came from and its sha256;
a heal command with a secret-looking value in it is not written there at
all: the heal reads it again from that file. heal-all runs a hook entry's
heal only from a ledger file that is the user's own and no one else may
write (``faults.ledger.untrusted``), and says when the target file changed
since the inject.

The effect is seen from the node's own URL, never from the hook's exit:
process_kill and network_partition make the health URL stop answering 200
(or, for a kill that a supervisor undid at once, the process's
``process_start_time_seconds`` change); process_pause makes it stop
answering at all. Other kinds are not observable from here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from ordeal import procfs
from ordeal.config import REDACTED, SECRET_ENV, ConfigError, redact_command
from ordeal.target import Hook, file_sha256, hook_command, read_target_file
from ordeal.topology import Node

from .base import Effect, Fault, FaultError, healed
from .ledger import Ledger, LedgerEntry

OUTPUT_CHARS = 4000
#: What a hook gets of the harness's environment besides the variables its
#: target file names (``hook_env``) and Ordeal's labels: enough for a shell
#: and its tools, and no secret.
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ",
            # where the tools a hook calls find their servers (kubectl in a pod,
            # docker, ssh), and the machine's proxies: addresses, not secrets
            "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "DOCKER_HOST",
            "XDG_RUNTIME_DIR", "SSH_AUTH_SOCK", "http_proxy", "https_proxy", "no_proxy",
            "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
#: Kinds whose effect the node's health URL shows (see the module docstring).
OBSERVED = ("process_kill", "process_pause", "network_partition")


def health(url: str, timeout: float = 2.0, context: Any = None) -> int | str:
    """The status a health URL answers now, or why it did not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except TimeoutError:
        return "timeout"
    except OSError as e:
        reason = getattr(e, "reason", e)
        return "timeout" if isinstance(reason, TimeoutError) else f"{type(reason).__name__}"


def process_start(metrics_url: str, timeout: float = 2.0, context: Any = None) -> float | None:
    """``process_start_time_seconds`` from a node's /metrics (vLLM exports
    it): a new value means a new process. None when not given."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout, context=context) as resp:
            for line in resp.read(4 << 20).decode("utf-8", "replace").splitlines():
                if line.startswith("process_start_time_seconds "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def hook_environment(labels: dict[str, str], hook_env: list[str]) -> dict[str, str]:
    """The whole environment a hook runs with: ``BASE_ENV`` and the
    variables named in ``hook_env`` as the harness has them, then Ordeal's
    ``labels``. Nothing else of the harness's environment, where the API
    key and any other secret of the user's may be."""
    env = {k: os.environ[k] for k in (*BASE_ENV, *hook_env) if k in os.environ}
    env.setdefault("PATH", os.defpath)
    return {**env, **labels}


def secret_values(env: dict[str, str], secret_envs: list[str]) -> list[str]:
    """What a hook's output and command must not show: the values of every
    secret-looking variable of the harness's environment and of the hook's,
    and of ``secret_envs`` (the API key's), longest first (a secret that
    holds another is replaced whole). A secret-looking name's value under 8
    characters is left (``TOKENIZERS_PARALLELISM=false`` would blank out
    every "false"); the named ``secret_envs`` from 4."""
    names = {n for n in (*os.environ, *env) if SECRET_ENV.search(n)}
    values = {v for n in names for v in (os.environ.get(n), env.get(n)) if v and len(v) >= 8}
    values |= {v for n in secret_envs for v in (os.environ.get(n), env.get(n))
               if v and len(v) >= 4}
    return sorted(values, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text


def run_hook(what: str, command: str, labels: dict[str, str], timeout_s: float,
             secret_envs: list[str], hook_env: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """Run one hook; what it did, for the history: its command (redacted),
    exit code, seconds, output (scrubbed) and the processes Ordeal ended
    (``ended``). ``FaultError`` when it cannot start, exits non-zero or
    outlives ``timeout_s``; its ``record`` holds the same. It runs with
    ``hook_environment`` only, with job control on (``set -m``): each
    command runs in a process group of its own, as in a terminal, so what
    it starts in the background (``cmd &``, ``nohup cmd &``, ``setsid cmd
    &``, ``setsid -f cmd``) outlives it. Its output goes to a file, not a
    pipe, so such a child does not hold the hook open. When bash has
    exited, what is still in the hook's own process group gets
    ``GRACE_S`` to leave or end, then is ended (``end_left_over``); a hook
    past its timeout has its whole session ended."""
    env = hook_environment(labels, list(hook_env))
    secrets = secret_values(env, secret_envs)
    shown = scrub(redact_command(command), secrets)
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(["bash", "-c", f"set -m; {command}"], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        except OSError as e:
            raise FaultError(f"{what}: cannot start bash for the hook ({e})") from None
        # Waited for without reaping: while bash is a zombie its pid, group
        # id and session id stay its own, so nothing ended below is another's.
        timed_out = not _exited(proc.pid, t0 + timeout_s)
        ended = end_left_over(proc.pid, whole_session=timed_out, secrets=secrets)
        if timed_out and proc.poll() is None:
            proc.kill()  # bash itself, not yet reaped: its pid is still its own
        proc.wait()
        out.seek(0)
        raw = out.read()
    # Scrubbed whole, then cut: a key across the cut would leave a piece.
    text = scrub(raw.decode("utf-8", "replace"), secrets)[-OUTPUT_CHARS:]
    done = {"command": shown, "exit_code": None if timed_out else proc.returncode,
            "seconds": round(time.monotonic() - t0, 2), "output": text, "ended": ended}
    said_ended = (f"; Ordeal ended {len(ended)} process(es) it left: "
                  + ", ".join(f"{e['pid']} {e['command']!r}" for e in ended[:3])
                  if ended else "")
    if timed_out:
        raise FaultError(f"{what}: the hook did not finish within its timeout_s "
                         f"{timeout_s:g} (ended); command {shown!r}; output: "
                         f"{text[-500:]!r}{said_ended}. Make it return sooner or raise "
                         "timeout_s", record=done)
    if proc.returncode != 0:
        raise FaultError(f"{what}: the hook exited {proc.returncode}; command {shown!r}; "
                         f"output: {text[-500:]!r}{said_ended}", record=done)
    return done


#: Seconds what is left in a hook's own process group after bash exited
#: gets to leave it (``setsid`` racing bash's exit) or end, before Ordeal
#: ends it.
GRACE_S = 2.0


def _exited(pid: int, deadline: float) -> bool:
    """Whether the child ``pid`` exited before ``deadline`` (monotonic),
    leaving it a zombie (``WNOWAIT``): its ids cannot be reused until
    ``Popen.wait`` reaps it."""
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def end_left_over(leader: int, whole_session: bool, secrets: list[str],
                  grace_s: float = GRACE_S) -> list[dict[str, Any]]:
    """End what a hook left: with ``whole_session`` (the hook outlived its
    timeout) every process of the session ``leader`` started, at once;
    else, after up to ``grace_s``, the processes still in its own process
    group (a background job of job control, a ``setsid`` child, a
    ``systemd-run`` unit left it and are the user's). Each by a pidfd
    opened while it was still a member, so a pid reused meanwhile is never
    touched. Returns one record per process ended: pid, command line
    (scrubbed), why."""
    def members() -> list[int]:
        return procfs.session_members(leader) if whole_session else procfs.group_members(leader)

    if whole_session:
        why = "the hook outlived its timeout_s: its whole session is ended"
    else:
        why = (f"still in the hook's own process group {grace_s:g} s after bash exited "
               "(a process meant to outlive a hook runs in the background or under setsid)")
        deadline = time.monotonic() + grace_s
        while members() and time.monotonic() < deadline:
            time.sleep(0.1)
    ended: list[dict[str, Any]] = []
    for _ in range(5):  # a member may fork while it is ended: ask again
        left = members()
        if not left:
            break
        for pid in left:
            command = scrub(redact_command(procfs.cmdline(pid)), secrets)[:300]
            if _kill_member(pid, leader, whole_session):
                ended.append({"pid": pid, "command": command, "why": why})
        time.sleep(0.05)
    return ended


def _kill_member(pid: int, leader: int, whole_session: bool) -> bool:
    """SIGKILL ``pid`` if, once a pidfd holds it, it is still a member of
    the hook's group (or session). True when it was sent. Where pidfds are
    not to be had (an old kernel, a sandbox), by pid after the same check:
    the hook's leader is not reaped yet, so its group and session ids are
    not another's."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        fields = procfs.stat_fields(pid)
        if not fields or int(fields[3 if whole_session else 2]) != leader:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
            return True
        except OSError:
            return False
    try:
        fields = procfs.stat_fields(pid)
        if not fields or int(fields[3 if whole_session else 2]) != leader:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class HookFault(Fault):
    """One fault kind on one node of an external deployment, by its hooks."""

    kind = "hook"  # each instance carries its own kind (the hook's)

    def __init__(self, node: Node, run_id: str, ledger: Ledger, hook: Hook,
                 ready_timeout_s: float = 300.0, secret_envs: tuple[str, ...] = (),
                 hook_env: tuple[str, ...] = (), target_file: str | None = None,
                 target_sha256: str | None = None, **params: Any):
        super().__init__(node.name, run_id, ledger)
        self.kind = hook.kind  # type: ignore[misc] - per instance, for windows and checkers
        self.node = node
        self.hook = hook
        self.ready_timeout_s = ready_timeout_s
        self.secret_envs = list(secret_envs)
        self.hook_env = list(hook_env)  # the target file's hook_env: passed by name
        self.target_file = None if target_file is None else str(target_file)
        self.target_sha256 = target_sha256
        self.params = params
        self._start_before: float | None = None
        self._heal_t0: float | None = None
        self._served_before = False  # whether to wait for it to serve after the heal

    def _env(self, fault_id: str) -> dict[str, str]:
        env = {"ORDEAL_NODE": self.node.name,
               "ORDEAL_NODE_URL": self.node.endpoint.url,
               "ORDEAL_KIND": self.hook.kind, "ORDEAL_RUN_ID": self.run_id,
               "ORDEAL_FAULT_ID": fault_id}
        for k, v in self.params.items():
            env[f"ORDEAL_PARAM_{k.upper()}"] = str(v)
        return env

    def _command(self, text: str) -> str:
        return hook_command(text, self.node.name)

    def _inverse(self) -> dict[str, Any]:
        """The heal hook, for the live heal and heal-all: the command itself
        only when nothing in it looks secret (else it is read again from the
        target file at heal time), the variables it gets by name, and the
        target file it came from with its sha256."""
        heal = self._command(self.hook.heal)
        shown = redact_command(heal)
        inverse = {"via": "hook", "node": self.node.name, "heal_shown": shown,
                   "timeout_s": self.hook.timeout_s, "secret_envs": self.secret_envs,
                   "hook_env": self.hook_env, "hook": {"kind": self.hook.kind,
                                                       "node": self.hook.node},
                   "target_file": self.target_file, "target_sha256": self.target_sha256}
        if shown == heal:
            inverse["heal"] = heal
        elif self.target_file is None:
            raise FaultError(f"{self.hook.kind} on {self.node.name}: the heal hook "
                             f"{shown!r} holds a secret-looking value, and there is no target "
                             "file to read it back from at heal time (the ledger never holds "
                             "a secret); put the secret in a variable named in hook_env and "
                             "write $NAME in the command")
        return inverse

    def _act(self) -> dict[str, Any]:
        assert self.entry is not None
        env = self._env(self.entry.id)
        self.entry.inverse["env"] = env  # heal-all gives the heal hook the same labels
        self.ledger.record(self.entry)
        self._served_before = health(self._health_url(), context=self._tls()) == 200
        if self.hook.kind in OBSERVED:
            self._start_before = process_start(self._metrics_url(), context=self._tls())
        try:
            done = run_hook(f"{self.hook.kind} on {self.node.name}: inject hook",
                            self._command(self.hook.inject), env, self.hook.timeout_s,
                            self.secret_envs, self.hook_env)
        except FaultError as e:
            e.record = {"via": "hook", "inject_hook": e.record}
            raise
        self.entry.inverse["inject_hook"] = done
        self.ledger.record(self.entry)
        return {"via": "hook", "inject_hook": done, "target_file": self.target_file,
                "target_sha256": self.target_sha256}

    def _tls(self) -> Any:
        return getattr(self.node, "ssl_context", None)

    def _health_url(self) -> str:
        return getattr(self.node, "health_url", None) or f"{self.node.endpoint.url}/health"

    def _metrics_url(self) -> str:
        return getattr(self.node, "metrics_url", None) or f"{self.node.endpoint.url}/metrics"

    def observe(self) -> Effect | None:
        if self.hook.kind not in OBSERVED:
            return None
        status = health(self._health_url(), context=self._tls())
        evidence: dict[str, Any] = {"health_url": self._health_url(), "health": status}
        if self.hook.kind == "process_pause":
            return Effect(status == "timeout", "the health URL answered nothing within 2 s",
                          evidence)
        if status != 200:
            return Effect(True, "the health URL did not answer 200", evidence)
        if self.hook.kind == "process_kill":
            now = process_start(self._metrics_url(), context=self._tls())
            evidence.update(process_start_before=self._start_before, process_start_now=now)
            if self._start_before is not None and now is not None:
                return Effect(now != self._start_before,
                              "the node's process_start_time_seconds changed", evidence)
        return Effect(False, "the health URL still answered 200", evidence)

    def _aftermath(self) -> dict[str, Any]:
        self._heal_t0 = time.monotonic()  # a restart's time runs from its heal hook
        return {}

    @classmethod
    def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
        """Run the entry's heal hook. When the target file it came from is
        gone or differs from the one the inject read (its sha256), the heal
        still runs and the result says so (``target_changed``)."""
        inv = entry.inverse
        source: dict[str, Any] = {}
        if inv.get("target_file"):
            now = file_sha256(inv["target_file"])
            source = {"target_file": inv["target_file"], "target_sha256": inv.get("target_sha256")}
            if now != inv.get("target_sha256"):
                source["target_changed"] = (
                    "is gone or unreadable now" if now is None else
                    f"changed since the inject (sha256 {inv.get('target_sha256')} then, {now} now)")
        command = inv.get("heal")
        if command is None:
            command = cls._heal_from_target(entry)
        try:
            done = run_hook(f"{entry.kind} on {entry.target}: heal hook", command,
                            dict(inv.get("env") or {}), float(inv.get("timeout_s", 60.0)),
                            list(inv.get("secret_envs") or []), list(inv.get("hook_env") or []))
        except FaultError as e:
            e.record = {"heal_hook": e.record, **source}
            raise
        return {"heal_hook": done, **source}

    @staticmethod
    def _heal_from_target(entry: LedgerEntry) -> str:
        """The heal command the ledger left out (it looked secret), read again
        from the target file the entry names; ``FaultError`` saying what to
        run by hand when that file or its hook is gone."""
        inv = entry.inverse
        path, hook = inv.get("target_file"), inv.get("hook") or {}
        by_hand = (f"run the heal by hand ({inv.get('heal_shown')!r}, its secret filled in) "
                   f"and remove the ledger entry {entry.id}")
        if not path:
            raise FaultError(f"{entry.kind} on {entry.target}: the ledger entry holds no heal "
                             f"command and names no target file; {by_hand}")
        try:
            spec = read_target_file(path)
        except ConfigError as e:
            raise FaultError(f"{entry.kind} on {entry.target}: the heal command looked secret, "
                             f"so the ledger holds only the name of its target file, which "
                             f"cannot be read now ({e}); {by_hand}") from None
        found = [h for h in spec.hooks if h.kind == hook.get("kind") and h.node == hook.get("node")]
        if not found:
            raise FaultError(f"{entry.kind} on {entry.target}: the target file {path} has no "
                             f"[[hook]] kind = {hook.get('kind')!r}, node = {hook.get('node')!r} "
                             f"any more; {by_hand}")
        return hook_command(found[0].heal, inv["node"])

    @classmethod
    def heal_line(cls, entry: LedgerEntry, done: dict[str, Any]) -> str:
        hook = done.get("heal_hook", {})
        changed = (f"; note: its target file {done['target_file']} {done['target_changed']}"
                   if done.get("target_changed") else "")
        return (f"{healed(entry)}: ran its heal hook {hook.get('command')!r} "
                f"(exit {hook.get('exit_code')}, {hook.get('seconds')} s){changed}")

    def _recover(self) -> dict[str, Any]:
        """The node serves again: its health URL answers 200. For a kill,
        ``restarted`` and ``ready_after_s`` (from the heal hook's start, as
        restart_readiness reads it). A node that did not serve before the
        inject is not waited for."""
        if not self._served_before:
            return {"serves_again_after_s": None,
                    "why": "the node did not answer 200 before the inject; not waited for"}
        t0 = self._heal_t0 or time.monotonic()
        deadline = time.monotonic() + self.ready_timeout_s
        status: int | str = "not asked"
        while time.monotonic() < deadline:
            status = health(self._health_url(), context=self._tls())
            if status == 200:
                out: dict[str, Any] = {"serves_again_after_s": round(time.monotonic() - t0, 2)}
                if self.hook.kind == "process_kill":
                    out.update(restarted=True, ready_after_s=out["serves_again_after_s"])
                return out
            time.sleep(0.5)
        hook = self.undone.get("heal_hook") or {}
        ended = hook.get("ended") or []
        raise FaultError(
            f"{self.hook.kind} on {self.node.name}: after the heal hook, "
            f"{self._health_url()} did not answer 200 within {self.ready_timeout_s:g}s "
            f"(last: {status}). The heal hook {hook.get('command')!r} exited "
            f"{hook.get('exit_code')} after {hook.get('seconds')} s and printed "
            f"{(hook.get('output') or '')[-500:]!r}; Ordeal ended "
            + (", ".join(f"{e['pid']} {e['command']!r} ({e['why']})" for e in ended)
               if ended else "none of its processes"),
            record={"serves_again_after_s": None, "last_health": status})
