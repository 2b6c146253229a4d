"""Before each run on a session's shared cluster: every node Ordeal started
is up, or is started again and said so.

One cluster serves every test of a session (a start costs 25-45 s). A node
that died in one run (a crash the run's own verdict judges:
invariants/node_health.py ``nodes_serve_at_end``) must not leave the next
run on one replica, where a fault on the dead node fails to inject and a
test that never met the crash fails for it. The restart is the system's
own start (the node's argv, unchanged), recorded in the run's summary under
``nodes_restarted_before_run`` with the exit status and last log lines, so
a reader sees that it happened and why. A deployment Ordeal did not start
(``--cluster external``) and Ray's actors (Ray restarts them itself) are
left as they are.
"""

from __future__ import annotations

from typing import Any, Callable

from faults.safety import down_detail

#: Backends whose nodes this harness started as processes or containers.
OWN_BACKENDS = ("local", "docker")


def revive_down_nodes(cluster: Any, ready_timeout_s: float,
                      say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Start again each node of ``cluster`` that is not running, and wait
    until it serves. Returns one record per node restarted (empty when all
    ran). A node that does not come back raises its NodeNotReady."""
    if getattr(cluster, "backend", None) not in OWN_BACKENDS:
        return []
    restarted = []
    for node in cluster.nodes:
        if node.is_running():
            continue
        why = down_detail(node)
        say(f"{node.name} is down before this run{why}; starting it again "
            "(the summary records it: nodes_restarted_before_run)")
        exit_code = getattr(node, "exit_code", None)
        restarted.append({"node": node.name, "down": why.strip(" ()") or "not running",
                          "exit_code": exit_code() if callable(exit_code) else None})
        node.stop(grace=5.0)  # what is left of its group (an engine child holding a port)
        node.start()
        node.wait_ready(ready_timeout_s)
    return restarted
