"""Least privilege (issue 11): every fault kind says whether it needs root and
why; a harness that is not root is refused a root fault before anything is
touched (no ledger entry, no iptables rule, no cgroup) with a message that
names the fault, what it needs and what to do; the faults that need no root
(process pause and kill of the harness's own processes, proxy toxics) work
as an unprivileged user, and so does a router the harness starts.

The unprivileged harness is a real child process run as ``nobody`` with
``setpriv`` (no capabilities). Trap: the venv's interpreter lives under
/root (mode 0700, pyenv), which nobody may not enter; the child runs in a
private mount namespace (``unshare -m``) where /root is a 0711 tmpfs holding
a bind mount of the interpreter's prefix. Nothing outside that namespace
changes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from faults.base import Fault, PrivilegeError
from faults.catalogue import REGISTRY, common_kinds

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "privilege_child.py"
ROOT_KINDS = {"network_partition", "packet_loss", "gpu_throttle"}


def test_every_kind_declares_whether_it_needs_root_and_why():
    for kind in common_kinds():
        cls = REGISTRY[kind]
        own = vars(cls)
        assert "needs_root" in own and "privilege" in own, f"{kind} does not declare it itself"
        assert len(cls.privilege) > 40, (kind, cls.privilege)
        assert bool(cls.without_root) == cls.needs_root, kind
    assert {k for k in common_kinds() if REGISTRY[k].needs_root} == ROOT_KINDS
    out = subprocess.run([sys.executable, "-m", "faults", "catalogue"], cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    for kind in common_kinds():
        [line] = [x for x in out.splitlines() if x.startswith(kind + " ")]
        assert f"root: {'yes' if kind in ROOT_KINDS else 'no '}" in line, line
        assert REGISTRY[kind].privilege in line, line
    assert "3 need root (gpu_throttle, network_partition, packet_loss)" in out, out


def test_a_root_fault_is_refused_with_what_to_do(monkeypatch, tmp_path):
    """In process, with the effective uid seen as 1000: the refusal comes
    before the preflight and before the ledger."""
    from faults.ledger import Ledger

    touched: list[str] = []

    class Probe(Fault):
        kind = ""  # not registered
        needs_root = True
        privilege = "it writes a rule"
        without_root = "the proxy instead"

        def _preflight(self) -> None:
            touched.append("preflight")

        def _inverse(self):
            return {}

        def _act(self):
            touched.append("act")
            return {}

        @classmethod
        def undo(cls, entry):
            return {}

    ledger = Ledger(tmp_path / "ledger")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PrivilegeError) as e:
        Probe("replica-0", "run-x", ledger).inject()
    msg = str(e.value)
    assert touched == [] and ledger.pending() == []
    assert msg.startswith(" on replica-0: refused, it needs root (it writes a rule)"), msg
    assert "(uid 1000)" in msg and "nothing was changed" in msg, msg
    assert "run the suite as root" in msg and "or use the proxy instead" in msg, msg
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    Probe("replica-0", "run-x", ledger).inject()
    assert touched == ["preflight", "act"]


def _hidden_ancestor(path: Path) -> Path | None:
    """The first directory above ``path`` that others may not enter."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


def unprivileged_argv(argv: list[str], home: Path) -> list[str]:
    """``argv`` as nobody:nogroup without capabilities, HOME and the state dir
    in ``home``. If the interpreter's prefix is under a directory nobody may
    not enter, a private mount namespace makes just that prefix reachable."""
    inner = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             "--inh-caps=-all", "env", "-i", f"HOME={home}", f"ORDEAL_STATE_DIR={home}/state",
             f"PYTHONPATH={REPO}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", *argv]
    prefix = Path(os.path.realpath(sys.base_prefix))
    hidden = _hidden_ancestor(prefix)
    if hidden is None:
        return inner
    script = (f"set -e; b=$(mktemp -d /tmp/ordeal-prefix-XXXXXX); "
              f"mount --bind {shlex.quote(str(prefix))} $b; "
              f"mount -t tmpfs -o mode=0711,size=1m ordeal-hide {shlex.quote(str(hidden))}; "
              f"mkdir -p {shlex.quote(str(prefix))}; mount --bind $b {shlex.quote(str(prefix))}; "
              f"umount $b; rmdir $b; exec {shlex.join(inner)}")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def _setpriv_missing() -> str | None:
    """Asked when each test is set up: util-linux's setpriv and unshare
    (.ci/setup installs util-linux), so under CI their absence fails."""
    missing = [t for t in ("setpriv", "unshare") if not shutil.which(t)]
    return f"{' and '.join(missing)} not on PATH (apt-get install util-linux)" if missing else None


def needs_setpriv(test):
    """Not root is a plain skip (a machine can be run without it); missing
    tools are a component .ci/setup installs, decided at set-up time."""
    test = pytest.mark.needs("util-linux setpriv and unshare", _setpriv_missing)(test)
    return pytest.mark.skipif(
        os.geteuid() != 0, reason="running a child harness as nobody needs root (to drop to "
        "nobody and, for a prefix under a private directory, to unshare a mount namespace)")(test)


def run_as_nobody(*args: str, timeout: float = 240) -> dict:
    home = Path(tempfile.mkdtemp(prefix="ordeal-nobody-"))
    try:
        os.chmod(home, 0o755)
        shutil.chown(home, "nobody", "nogroup")
        proc = subprocess.run(unprivileged_argv([sys.executable, str(CHILD), *args[:1],
                                                 str(home), *args[1:]], home),
                              cwd=REPO, capture_output=True, text=True, timeout=timeout)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, (
            f"child as nobody failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-3000:]}")
        return json.loads(lines[-1][len("RESULT "):])
    finally:
        shutil.rmtree(home, ignore_errors=True)


def iptables_rules() -> str:
    if not shutil.which("iptables"):
        return ""
    return subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True,
                          timeout=60).stdout


@needs_setpriv
@pytest.mark.timeout(180)
def test_unprivileged_harness_is_refused_root_faults_and_runs_the_others():
    out = run_as_nobody("processes")
    assert out["uid"] == 65534, out
    for kind in ROOT_KINDS:
        msg = out["refused"][kind]
        assert msg.startswith(f"{kind} on replica-0: refused, it needs root ("), (kind, msg)
        assert "runs as nobody (uid 65534); nothing was changed" in msg, msg
        assert "run the suite as root" in msg and "or use " in msg, msg
    assert out["ledger_after_refusals"] == 0, out
    assert f"ordeal:{out['run_id']}" not in iptables_rules()
    cg = [p for p in Path("/sys/fs/cgroup").glob("*/ordeal-*")] if Path(
        "/sys/fs/cgroup").is_dir() else []
    assert not cg, cg  # no cgroup of ours was created (none is left by others either)
    # The faults that need no root worked on the child's own process.
    assert out["paused_states"] and out["answered_while_paused"] is False, out
    assert out["answers_after_pause"], out
    assert out["kill"]["signal"] == "SIGKILL" and out["killed_old_pid_gone"], out
    assert out["kill_heal"]["restarted"] and out["restarted_new_pid"], out
    assert out["ledger_at_end"] == 0, out


@needs_setpriv
@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_unprivileged_harness_runs_a_router_and_proxy_faults(ordeal_cluster, ordeal_say):
    c = ordeal_cluster
    spec = {"replicas": [{"name": r.name, "host": r.endpoint.host, "port": r.endpoint.port}
                         for r in c.replicas()],
            "links": [{"name": x.name, "src": x.src, "dst": x.dst,
                       "listen": [x.listen.host, x.listen.port],
                       "upstream": [x.upstream.host, x.upstream.port],
                       "control": [x.control.host, x.control.port]} for x in c.links],
            "link": "router-replica-1"}
    out = run_as_nobody("router", json.dumps(spec))
    ordeal_say(f"unprivileged harness: {out}")
    assert out["uid"] == 65534 and out["router_uid"] == 65534, out
    assert out["served_s"] < 30 and out["served_while_paused"] is False, out
    assert out["served_after_pause_s"] < 30, out
    assert out["toxics_while_injected"] >= 1 and out["toxics_after_heal"] == 0, out
    assert out["latency_added_s"] >= 0.3, out
    assert out["ledger_at_end"] == 0, out
