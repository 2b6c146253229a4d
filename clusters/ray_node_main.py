"""One simulated Ray node as a foreground process: ``python -m
clusters.ray_node_main --head|--address 127.0.0.1:PORT ...``.

Why not ``ray start --block``: Ray 2.60 turns ``--node-ip-address
127.0.0.1`` (and ``--address 127.0.0.1:P``) into the machine's external
address (``services.resolve_ip_for_localhost``), so every process of the
cluster advertised, and the client server listened on, an address outside
loopback (seen: 192.0.2.2). Ray keeps loopback only when
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and then ``ray start`` refuses to
start a worker node. So this starts the node the way ``ray start`` does
(``ray._private.node.Node``, as ``ray.cluster_utils`` does too) with
``node_ip_address="127.0.0.1"`` fixed, and the variable set for every
child (raylet, agents, workers), so nothing resolves to another address.

It stays in the foreground so the suite owns it as a ManagedProcess: Ray
starts its services (gcs_server, raylet, agents) and the raylet its workers
in the caller's process group, so a signal to this group reaches the whole
node and nothing else. SIGTERM stops the node's processes gracefully.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from ordeal import cgroup2

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback stays loopback
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clusters.ray_node_main")
    ap.add_argument("--head", action="store_true")
    ap.add_argument("--address", help="the head's GCS address, for a worker node")
    ap.add_argument("--port", type=int, help="the head's GCS port")
    ap.add_argument("--temp-dir", required=True)
    ap.add_argument("--resources", default="{}")
    ap.add_argument("--socket-prefix", required=True, help="unique per node, e.g. n0")
    ap.add_argument("--num-cpus", type=int, default=0)
    ap.add_argument("--object-store-bytes", type=int, default=80 * 1024 * 1024)
    ap.add_argument("--min-worker-port", type=int, required=True)
    ap.add_argument("--max-worker-port", type=int, required=True)
    ap.add_argument("--ports", required=True,
                    help="JSON: node_manager, object_manager, dashboard_agent_listen, "
                         "metrics_agent, runtime_env_agent, metrics_export, ray_client_server, "
                         "dashboard (head)")
    ap.add_argument("--cgroup", help="a cgroup v2 directory to join before anything starts, "
                                     "so every process of the node is born in it (the "
                                     "ray_node_partition fault names it in its rules)")
    args = ap.parse_args(argv)
    if bool(args.head) == bool(args.address):
        ap.error("give --head or --address, not both")
    if args.cgroup:
        try:
            cgroup2.join(Path(args.cgroup))
        except OSError as e:
            print(f"ray node: cannot join cgroup {args.cgroup}: {e}", file=sys.stderr, flush=True)
            return 2

    import ray._private.node
    import ray._private.parameter
    from ray._private import ray_constants

    assert not ray_constants.ENABLE_RAY_CLUSTER, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 not seen"
    ports = json.loads(args.ports)
    params = ray._private.parameter.RayParams(
        node_ip_address="127.0.0.1",
        node_name=os.environ.get("ORDEAL_NODE", "ordeal-ray-node"),
        min_worker_port=args.min_worker_port,
        max_worker_port=args.max_worker_port,
        node_manager_port=ports["node_manager"],
        object_manager_port=ports["object_manager"],
        dashboard_agent_listen_port=ports["dashboard_agent_listen"],
        metrics_agent_port=ports["metrics_agent"],
        runtime_env_agent_port=ports["runtime_env_agent"],
        metrics_export_port=ports["metrics_export"],
        object_store_memory=args.object_store_bytes,
        num_cpus=args.num_cpus,
        num_gpus=0,
        resources=json.loads(args.resources),
        temp_dir=args.temp_dir,
        include_log_monitor=False,
        include_dashboard=False,
        # Names of our own: nodes started side by side in one temp dir
        # otherwise drew the same socket names ("bind: Address already in
        # use", the second raylet aborted).
        raylet_socket_name=os.path.join(args.temp_dir, f"{args.socket_prefix}-raylet"),
        plasma_store_socket_name=os.path.join(args.temp_dir, f"{args.socket_prefix}-plasma"),
    )
    if args.head:
        params.update(gcs_server_port=args.port, ray_client_server_port=ports["ray_client_server"],
                      dashboard_port=ports["dashboard"], dashboard_host="127.0.0.1")
    else:
        params.update(gcs_address=args.address)
    node = ray._private.node.Node(params, head=bool(args.head), shutdown_at_exit=False,
                                  spawn_reaper=False)
    print(f"ORDEAL_RAY_NODE_UP address={node.address} node_id={node.node_id} "
          f"ip={node.node_ip_address}", flush=True)

    stopping = {"now": False}

    def on_term(signum: int, frame: object) -> None:
        stopping["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        while not stopping["now"]:
            time.sleep(0.5)
            dead = node.dead_processes()
            if any(name in ("raylet", "gcs_server") for name, _ in dead):
                print(f"ray node: {[n for n, _ in dead]} exited; stopping the node",
                      flush=True)
                return 1
    finally:
        node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
