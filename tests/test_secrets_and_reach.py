"""Secrets and blast radius (issue 39, items 7-10), without a cluster.

7. A secret in the command line (a flag's value, an env pair, a header,
   inside ``--engine-args``/``--router-args``) never reaches the replay line,
   a node's log banner or its process record; everything else stays.
8. Hooks: a node name is matched whole, ``{node}`` is shell-quoted, a hook
   gets a small environment, its command is recorded redacted and every
   secret-looking variable's value is scrubbed from its output.
9. heal-all runs a hook entry's heal only from a ledger file (and directory)
   of the user's that no one else may write; an entry names its target
   file's sha256 and the heal says when that file changed.
10. ``--allow-target`` wider than an IPv4 /16 (IPv6 /48) needs
    ``--allow-wide-target``; the session says what is reachable.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.heal_all import heal_all
from faults.hook import HookFault
from faults.ledger import Ledger
from runs.replay import replay_line
from nodes.external import ExternalNode
from nodes.ports import free_ports
from nodes.process import ManagedProcess
from ordeal import networks
from ordeal.config import ConfigError, redact_argv
from ordeal.ownership import record_path
from ordeal.target import Hook, read_target_file
from ordeal.topology import Endpoint

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-LIVE-0123456789abcdef"


# -- 7: redaction of command lines -------------------------------------------------


def test_a_key_inside_engine_args_is_hidden_and_the_seed_kept():
    argv = ["--engine-args", f"--api-key {KEY} --dtype bfloat16", "--seed", "7"]
    shown = redact_argv(argv)
    assert KEY not in " ".join(shown), shown
    assert shown[2:] == ["--seed", "7"], shown  # not the seed's value hidden instead
    assert "--dtype bfloat16" in shown[1], shown
    line = replay_line("suites/test_smoke.py::test_x", argv)
    assert KEY not in line and "--seed 7" in line, line


SECRET_FLAGS = ["--api-key", "--hf-token", "--client-secret", "--db-password",
                "--credentials", "--auth"]
SECRET_ENVS = ["HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD", "MY_SECRET"]
PLAIN_FLAGS = ["--seed", "--dtype", "--max-num-seqs", "--load-rate", "--block-size"]
PLAIN_ENVS = ["OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE"]
NESTING = ["--engine-args", "--router-args"]

secret_values = st.text("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ0123456789-_./+",
                        min_size=8, max_size=24).map(lambda s: "SK" + s)
plain_values = st.integers(0, 10**6).map(lambda n: f"keep{n}")


@st.composite
def element(draw, nested_ok: bool = True) -> tuple[list[str], list[str], list[str]]:
    """One piece of a command line: (its arguments, secrets planted in it,
    plain values that must stay)."""
    shape = draw(st.sampled_from(["flag", "flag=", "secret", "secret=", "secret'", "env",
                                  "env=", "plain-env", "header", "url",
                                  *(["nested", "nested="] if nested_ok else [])]))
    secret, plain = draw(secret_values), draw(plain_values)
    sflag, pflag = draw(st.sampled_from(SECRET_FLAGS)), draw(st.sampled_from(PLAIN_FLAGS))
    senv, penv = draw(st.sampled_from(SECRET_ENVS)), draw(st.sampled_from(PLAIN_ENVS))
    if shape == "flag":
        return [pflag, plain], [], [plain]
    if shape == "flag=":
        return [f"{pflag}={plain}"], [], [plain]
    if shape == "secret":
        return [sflag, secret], [secret], []
    if shape == "secret=":
        return [f"{sflag}={secret}"], [secret], []
    if shape == "secret'":  # quoted once more, as a shell would leave it in a nested line
        return [sflag, shlex.quote(secret + " ")], [secret], []
    if shape == "env":
        return ["--engine-env", f"{senv}={secret}"], [secret], []
    if shape == "env=":
        return [f"--engine-env={senv}={secret}"], [secret], []
    if shape == "plain-env":
        return ["--engine-env", f"{penv}={plain}"], [], [plain]
    if shape == "header":
        return ["-H", f"Authorization: Bearer {secret}"], [secret], []
    if shape == "url":  # a password in a URL has no '/', '+' (percent-encoded there)
        secret = secret.replace("/", "x").replace("+", "y")
        return ["--upstream", f"https://user:{secret}@10.0.0.1/v1"], [secret], []
    inner = draw(st.lists(element(nested_ok=False), min_size=1, max_size=4))
    args = [a for parts, _, _ in inner for a in parts]
    # As a user writes it: plain words joined, or each quoted where need be.
    plain_words = not any(c.isspace() for a in args for c in a)
    text = draw(st.sampled_from([shlex.join, " ".join] if plain_words else [shlex.join]))(args)
    flag = draw(st.sampled_from(NESTING))
    secrets = [s for _, ss, _ in inner for s in ss]
    plains = [p for _, _, ps in inner for p in ps]
    return ([flag, text] if shape == "nested" else [f"{flag}={text}"]), secrets, plains


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(element(), min_size=1, max_size=6))
def test_no_planted_secret_survives_redaction_and_plain_values_stay(pieces):
    argv = [a for parts, _, _ in pieces for a in parts]
    secrets = [s for _, ss, _ in pieces for s in ss]
    plains = [p for _, _, ps in pieces for p in ps]
    shown = redact_argv(argv)
    assert len(shown) == len(argv), (argv, shown)  # argument for argument
    line = replay_line("suites/test_smoke.py::test_x", argv)
    for text in (" ".join(shown), line):
        for secret in secrets:
            assert secret not in text, (argv, text)
        for plain in plains:
            assert plain in text, (argv, text)


def test_a_node_s_log_banner_and_process_record_hide_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("ORDEAL_STATE_DIR", str(tmp_path / "state"))
    argv = ["/bin/sh", "-c", "exit 0", "sh", "--api-key", KEY, "--seed", "7"]
    proc = ManagedProcess("replica-9", argv, {"PATH": os.defpath}, tmp_path / "node.log",
                          "cluster-test")
    proc.start()
    try:
        record = record_path("cluster-test", "replica-9").read_text()
    finally:
        proc.stop(grace=5.0)
    log = (tmp_path / "node.log").read_text()
    assert KEY not in log and KEY not in record, (log, record)
    assert "--seed 7" in log and "<redacted>" in log, log


# -- 8: hooks -------------------------------------------------------------------------


def idle_node(name: str = "replica-0") -> ExternalNode:
    [port] = free_ports(1, "127.0.0.1")
    return ExternalNode(name, "replica", Endpoint("127.0.0.1", port))


def test_a_replica_name_with_a_trailing_newline_is_refused(tmp_path):
    path = tmp_path / "target.toml"
    path.write_text('entrypoint = "http://127.0.0.1:80"\nmodel = "m"\n'
                    '[[replica]]\nname = "replica-0\\n"\nurl = "http://127.0.0.1:81"\n')
    with pytest.raises(ConfigError, match="use letters, digits"):
        read_target_file(path)


def test_the_node_name_reaches_the_hook_quoted(tmp_path):
    """A name with shell syntax in it is one word to the hook, not code."""
    planted = tmp_path / "planted"
    node = idle_node(f"replica-0; touch {planted}")
    hook = Hook("process_pause", "*", "printf '%s|' {node}", "true", 10.0)
    fault = HookFault(node, "run-x", Ledger(tmp_path / "ledger"), hook)
    done = fault.inject()
    assert not planted.exists()
    assert done["inject_hook"]["output"] == f"replica-0; touch {planted}|", done
    fault.heal()


def test_a_hook_gets_a_small_environment_and_its_secrets_are_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("ORDEAL_UNRELATED", "harness-only-value")
    monkeypatch.setenv("KUBECONFIG", "/tmp/kubeconfig-of-the-test")
    monkeypatch.setenv("TEAM_DB_PASSWORD", "hunter2-of-the-db")
    monkeypatch.setenv("CLOUD_TOKEN", "cloud-token-value-42")
    ledger = Ledger(tmp_path / "ledger")
    hook = Hook("process_pause", "*",
                f"env; echo pw=$TEAM_DB_PASSWORD; true --token={KEY} --seed 7",
                f"true --api-key {KEY}; touch {tmp_path}/healed", 10.0)
    target = tmp_path / "target.toml"
    target.write_text("# the file the hook came from\n")
    fault = HookFault(idle_node(), "run-x", ledger, hook,
                      hook_env=("KUBECONFIG", "TEAM_DB_PASSWORD"), target_file=str(target),
                      target_sha256=hashlib.sha256(target.read_bytes()).hexdigest())
    # The heal looks secret, so the ledger keeps only the target file's name:
    # here a file without the hook, so the heal cannot be found again.
    done = fault.inject()
    out = done["inject_hook"]["output"]
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert "ORDEAL_UNRELATED" not in env and "CLOUD_TOKEN" not in env, out
    assert env["KUBECONFIG"] == "/tmp/kubeconfig-of-the-test", out
    assert env["ORDEAL_NODE"] == "replica-0" and "PATH" in env, out
    assert "hunter2-of-the-db" not in out and "pw=<redacted>" in out, out
    assert KEY not in done["inject_hook"]["command"], done
    assert "--seed 7" in done["inject_hook"]["command"], done
    entry = ledger.path(fault.entry.id).read_text()
    assert KEY not in entry and "hunter2" not in entry, entry
    with pytest.raises(Exception, match="cannot be read now.*run the heal by hand"):
        fault.heal()


# -- 9: the ledger is executable ------------------------------------------------------


def hook_target(tmp_path: Path, heal: str) -> Path:
    path = tmp_path / "target.toml"
    path.write_text(textwrap.dedent(f"""\
        entrypoint = "http://127.0.0.1:80"
        model = "m"
        [[replica]]
        name = "replica-0"
        url = "http://127.0.0.1:81"
        [[hook]]
        kind = "process_pause"
        node = "*"
        inject = "true"
        heal = {json.dumps(heal)}
        """))
    return path


def inject_from(path: Path, ledger: Ledger) -> HookFault:
    """A hook fault of the target file at ``path``, injected, as
    clusters/external.py makes one."""
    spec = read_target_file(path)
    hook = spec.hook("process_pause", "replica-0")
    fault = HookFault(idle_node(), "run-crashed", ledger, hook, target_file=str(spec.path),
                      target_sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    fault.inject()
    return fault


@pytest.mark.parametrize("loosen", ["file", "directory"])
def test_heal_all_refuses_a_heal_from_a_ledger_file_others_may_write(tmp_path, loosen):
    healed = tmp_path / "healed"
    ledger = Ledger(tmp_path / "ledger")
    fault = inject_from(hook_target(tmp_path, f"touch {healed}"), ledger)
    path = ledger.path(fault.entry.id)
    os.chmod(path if loosen == "file" else ledger.dir, 0o666 if loosen == "file" else 0o777)
    lines = heal_all(ledger)
    assert not healed.exists(), lines  # the command was not run
    [line] = lines
    assert "REFUSED" in line and str(path) in line and "writable" in line, line
    assert "chmod go-w" in line, line
    assert [e.id for e in ledger.pending()] == [fault.entry.id]  # left in place
    os.chmod(path if loosen == "file" else ledger.dir, 0o600 if loosen == "file" else 0o700)
    lines = heal_all(ledger)
    assert healed.exists() and "ran its heal hook" in lines[0], lines
    assert ledger.pending() == []


def test_a_hook_entry_names_its_target_file_s_digest_and_the_heal_says_it_changed(tmp_path):
    healed = tmp_path / "healed"
    ledger = Ledger(tmp_path / "ledger")
    path = hook_target(tmp_path, f"touch {healed}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    fault = inject_from(path, ledger)
    entry = json.loads(ledger.path(fault.entry.id).read_text())
    assert entry["inverse"]["target_sha256"] == digest, entry
    assert entry["inverse"]["target_file"] == str(path.resolve()), entry
    assert os.stat(ledger.path(fault.entry.id)).st_mode & 0o077 == 0  # the user's alone
    path.write_text(path.read_text() + "# edited after the inject\n")
    lines = heal_all(ledger)
    assert healed.exists(), lines  # healed all the same
    assert "changed since the inject" in lines[0] and digest in lines[0], lines


def test_a_heal_that_looks_secret_is_read_again_from_the_target_file(tmp_path):
    healed = tmp_path / "healed"
    ledger = Ledger(tmp_path / "ledger")
    fault = inject_from(hook_target(tmp_path, f"true --token={KEY}; touch {healed}"), ledger)
    assert KEY not in ledger.path(fault.entry.id).read_text()
    lines = heal_all(ledger)
    assert healed.exists() and KEY not in " ".join(lines), lines


# -- 10: how wide --allow-target may be -----------------------------------------------


@pytest.mark.parametrize("net, wide", [("0.0.0.0/0", True), ("10.0.0.0/8", True),
                                       ("10.1.0.0/16", False), ("10.1.2.0/24", False),
                                       ("10.1.2.3", False), ("::/0", True),
                                       ("2001:db8::/32", True), ("2001:db8:1::/48", False)])
def test_networks_wider_than_a_16_or_a_48_are_too_wide(net, wide):
    assert (networks.too_wide(ipaddress.ip_network(net)) is not None) is wide


def collect(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_config.py",
         "--collect-only", "-q", *options],
        cwd=REPO, capture_output=True, text=True, timeout=180)


def test_allow_target_0_0_0_0_0_is_refused_without_allow_wide_target():
    out = collect("--allow-target", "0.0.0.0/0")
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error
    assert "--allow-target 0.0.0.0/0" in out.stderr and "--allow-wide-target" in out.stderr, \
        out.stderr
    wide = collect("--allow-target", "0.0.0.0/0", "--allow-target", "10.1.2.0/24",
                   "--allow-wide-target")
    assert wide.returncode == 0, wide.stdout + wide.stderr
    assert "0.0.0.0 to 255.255.255.255, 4,294,967,296 addresses" in wide.stdout, wide.stdout
    assert "10.1.2.0 to 10.1.2.255, 256 addresses" in wide.stdout, wide.stdout


def test_engine_flags_that_only_look_like_secrets_keep_their_values():
    """Flags are secret by whole words of their name: --max-num-batched-tokens
    and --tokenizer keep their values (the replay line must still run), and
    a secret flag given no value does not swallow the next flag."""
    from ordeal.config import redact_argv

    argv = ["--engine-args", "--max-num-batched-tokens 4096 --tokenizer /m "
            "--skip-tokenizer-init --dtype bfloat16 --api-key sk-LIVE", "--seed", "7"]
    out = redact_argv(argv)
    assert "sk-LIVE" not in " ".join(out)
    assert "--max-num-batched-tokens 4096 --tokenizer /m --skip-tokenizer-init --dtype " \
           "bfloat16" in out[1] and out[2:] == ["--seed", "7"], out
    assert redact_argv(["--api-key", "--dtype", "half"]) == ["--api-key", "--dtype", "half"]
