"""What a hook leaves behind (issue 47): a process a hook starts in the
background in the shapes users write outlives the hook; what is still in
the hook's own process group after bash exited is ended and named; every
hook run, failed or not, is in the fault's record; a heal that waits for
health and gives up says what its hook printed and what was ended.

The hooks are real bash; the node of the last test is a real process (a
plain HTTP server) that the hook kills. The same rules on a real vLLM
stack: tests/test_external_target.py (its heal hook is ``setsid ... &``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.base import FaultError
from faults.hook import HookFault, health, run_hook
from faults.ledger import Ledger
from faults.nemesis import inject_then_heal
from nodes.external import ExternalNode
from nodes.ports import free_ports
from ordeal.history.writer import History
from ordeal.target import Hook
from ordeal.topology import Endpoint


def wait_for(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.1)
    return path.exists()


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie nobody reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("shape", ["{cmd} &", "nohup {cmd} >/dev/null 2>&1 &",
                                   "setsid {cmd} &", "setsid -f {cmd}"])
def test_a_process_started_in_the_background_outlives_the_hook(tmp_path, shape):
    """The shapes of a start script's last line. The child writes its mark
    after the hook returned and after the grace, so only a child that was
    left alone writes it."""
    mark = tmp_path / "started"
    cmd = f"bash -c 'sleep 3; touch {mark}'"
    done = run_hook("test hook", shape.format(cmd=cmd) + "\necho returned", {}, 10.0, [])
    assert done["exit_code"] == 0 and "returned" in done["output"], done
    assert done["ended"] == [], done
    assert not mark.exists()  # it returned before the child's work
    assert wait_for(mark, 15), f"{shape}: the background child was ended with the hook"


def test_a_child_left_in_the_hook_s_own_group_is_ended_and_named(tmp_path):
    """Job control turned off, a background child stays in the hook's group:
    it is ended after the grace, and the record names its pid, command
    line and why."""
    pidfile = tmp_path / "child.pid"
    done = run_hook("test hook", f"set +m; sleep 300 & echo $! > {pidfile}; echo left it",
                    {}, 10.0, [])
    pid = int(pidfile.read_text())
    assert [e["pid"] for e in done["ended"]] == [pid], done
    assert done["ended"][0]["command"] == "sleep 300", done
    assert "process group" in done["ended"][0]["why"], done
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(pid)


def test_a_failed_hook_keeps_its_record_in_the_error(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    node = ExternalNode("replica-0", "replica", Endpoint("127.0.0.1", free_ports(1)[0]))
    hook = Hook("process_kill", "*", "echo about to fail; exit 3", "true", 5.0)
    with pytest.raises(FaultError) as caught:
        HookFault(node, "run-x", ledger, hook).inject()
    record = caught.value.record["inject_hook"]
    assert record["exit_code"] == 3 and "about to fail" in record["output"], record
    assert record["command"] == "echo about to fail; exit 3" and record["ended"] == []


def test_a_heal_that_gives_up_waiting_says_what_its_hook_printed_and_ended(tmp_path):
    """A real server process is the node; the inject kills it, the heal hook
    is broken (it leaves a child in its own group and starts nothing). The
    window's error says what the hook printed and the child Ordeal ended;
    the window and the history keep the heal hook's record."""
    port = free_ports(1)[0]
    (tmp_path / "health").write_text("ok")
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1", "--directory", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        node = ExternalNode("replica-0", "replica", Endpoint("127.0.0.1", port))
        deadline = time.monotonic() + 30
        while health(f"http://127.0.0.1:{port}/health") != 200:
            assert time.monotonic() < deadline, "the test's server did not start"
            time.sleep(0.2)
        hook = Hook("process_kill", "*", f"kill -KILL {server.pid}",
                    "set +m; sleep 300 & echo trying to start it", 10.0)
        fault = HookFault(node, "run-x", Ledger(tmp_path / "ledger"), hook, ready_timeout_s=2.0)
        history = History(tmp_path / "history.jsonl")
        window = asyncio.run(inject_then_heal(fault, history, 0.0, 0.5))
        history.close()
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    assert window.error and "did not answer 200 within 2s" in window.error, window
    assert "trying to start it" in window.error and "sleep 300" in window.error, window.error
    ended = window.heal_result["heal_hook"]["ended"]
    assert [e["command"] for e in ended] == ["sleep 300"], window.heal_result
    ops = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    heal_end = [o for o in ops if o.get("f") == "heal" and (o.get("value") or {}).get(
        "phase") == "end"]
    assert heal_end and heal_end[-1]["value"]["heal_hook"]["ended"][0]["pid"] == ended[0]["pid"]
    assert not any(os.path.exists(f"/proc/{e['pid']}") and not gone(e["pid"]) for e in ended)
