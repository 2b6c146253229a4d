"""Chaos Mesh manifests for an Ordeal schedule (``python -m faults export --chaos-mesh``).

For a team that runs Chaos Mesh on its Kubernetes cluster: the same faults
at the same times as an Ordeal schedule, written as Chaos Mesh objects
(``apiVersion: chaos-mesh.org/v1alpha1``), checked against the CRDs of Chaos
Mesh v2.8.3 (``tests/data/chaos_mesh_crds_v2.8.3.json``). Nothing here talks
to a cluster: the functions are pure (schedule and options in, dicts out)
but for reading the schedule file and writing the output directory.

What is written (``write_export``)::

    OUT/workflow.yaml          one Workflow: the whole schedule, timed
    OUT/steps/f00-....yaml     one object per fault and target, with its
                               ``duration``: to apply one fault by hand
    OUT/summary.txt            what was exported, what was not and why

One document per file. Without PyYAML (not a dependency of Ordeal) the YAML
is written by ``to_yaml``: block style, every string that YAML could read as
anything else double-quoted. ``--format json`` writes JSON instead (JSON is
YAML too; kubectl takes both).

Sequencing: a Workflow, not a Schedule. Chaos Mesh's ``Schedule`` repeats
ONE chaos on a cron line (``spec.schedule``, ``concurrencyPolicy``); it has
no one-off sequence of different faults at given offsets. A ``Workflow`` runs
once, and its templates say exactly that: ``Suspend`` (wait its
``deadline``), ``Serial`` and ``Parallel`` (children in turn, or together),
and a chaos template whose ``deadline`` is how long the fault is held (in a
Workflow an embedded chaos must NOT have a ``duration``: the webhook rejects
it, api/v1alpha1/workflow_webhook.go). An inject and its paired heal (same
key) become one chaos template held from the inject to the heal:

- faults that never overlap (every schedule ``plan_schedule`` draws): the
  entry is a ``Serial`` of ``Suspend`` (the quiet gap) and chaos templates;
- faults that overlap (a hand-written or explored schedule may): the entry
  is a ``Parallel`` of one ``Serial`` per fault (``Suspend`` until its inject
  time, then the fault), so each starts at its own offset.

A fault that is not exported leaves its time as quiet time: the others keep
their offsets. Chaos Mesh starts each node when the one before it ends, so
in the Serial form the controller's latency (a second or so per step,
unmeasured here) accumulates; the standalone objects in ``steps/`` carry
their offset (annotation ``ordeal/at-s``) for applying by hand instead.

Targets. The schedule names nodes as Ordeal's clusters do; a manifest needs
label selectors (always in ``--namespace``):

- ``one`` / ``all``: the replica pods (``--selector KEY=VALUE``, every
  replica pod has those labels and no other pod does), ``mode: one|all``;
- ``minority`` / ``majority``: ``mode: fixed`` with the count Ordeal would
  take (faults.targets.select), which needs ``--replicas N``;
- a node name (``replica-0``, ``router``, or a comma list): the pods of
  ``--node NAME=KEY=VALUE[,KEY=VALUE]`` (used as written, not merged with
  ``--selector``), ``mode: all``; a list gives one object per name, run
  together (a ``Parallel`` template);
- a link (``router-replica-0``, ``client-router``): the router's pods
  (``--node router=...``) and the replica's. ``network_latency`` and
  ``bandwidth_limit`` on ``router-X`` act on the router pods with ``target``
  the pods of X and ``direction`` upstream -> ``to`` (router to X),
  downstream -> ``from`` (X to router), both -> ``both``; on
  ``client-router`` the load generator is outside the cluster, so only
  downstream exports: the router's packets to ``--client-cidr`` (Chaos Mesh
  takes external targets with direction ``to`` only). HTTP faults act on
  the server end of the link (X, or the router for client-router) on
  ``--http-port`` (``--router-http-port`` for the router). A link word
  (``one``, ``all``) is a choice Ordeal makes among its fault proxy's links
  when the run starts: not exported.

The kinds (checked against api/v1alpha1/*_types.go and the webhooks of
Chaos Mesh v2.8.3):

====================  =======================================================
network_partition     NetworkChaos ``partition``, direction both, no target:
                      every packet in and out of the pod is dropped (mode
                      drop; mode reject, a TCP reset, has no equivalent)
packet_loss           NetworkChaos ``loss`` (percent) on the pod's egress
network_latency       NetworkChaos ``delay`` (latency, jitter) on the link
bandwidth_limit       NetworkChaos ``bandwidth`` (tbf: rate, limit, buffer)
connection_reset      HTTPChaos ``abort`` (only at the first bytes:
                      ``timeout_ms=0``, ``after_bytes=0``)
http_fault            HTTPChaos: abort -> replace code, body and
                      content type of the response; delay_head -> delay;
                      error_event, truncate, malformed: none
clock_drift           TimeChaos ``timeOffset`` on CLOCK_REALTIME (mode
                      offset; drift and strobe have none)
process_kill          PodChaos ``pod-kill`` (or ``container-kill``, see
                      ``--kill``); scope node and restart=true only
gpu_memory_pressure   StressChaos memory stressor, only for backend='cpu'
                      (host RAM); Chaos Mesh has no GPU memory stressor
process_pause         none: PodChaos has pod-kill, pod-failure and
                      container-kill, no SIGSTOP
gpu_throttle          none: no GPU stressor, no CPU quota
lsn_jump              none: no action on single events of a stream
ray_node_*            none: Ray-only kinds
====================  =======================================================

Any parameter a mapping does not know, and a ``toxicity`` below 1 (Chaos
Mesh acts on every packet or request of the pods it selects), leaves the
fault out with the reason; Ordeal's own waits (``ready_timeout_s``,
``gone_within_s``, ``orphan_bound_s``) are ignored. Each mapping's
approximation is written beside it (``NOTES``) and in summary.txt. Why a
kind has no equivalent is declared by the kind (``KindTraits.chaos_mesh_none``).
"""

from __future__ import annotations

from .documents import export
from .files import describe, summary_lines, write_export
from .mapping import MAPPERS, NOTES, Exported, LeftOut, map_fault
from .model import (
    KILL_ACTIONS,
    SUMMARY,
    ExportError,
    Options,
    constructor_defaults,
    default_run_id,
    held_faults,
    num,
    read_schedule_file,
)
from .yaml import to_yaml

__all__ = [
    "ExportError",
    "Exported",
    "KILL_ACTIONS",
    "LeftOut",
    "MAPPERS",
    "NOTES",
    "Options",
    "SUMMARY",
    "constructor_defaults",
    "default_run_id",
    "describe",
    "export",
    "held_faults",
    "map_fault",
    "num",
    "read_schedule_file",
    "summary_lines",
    "to_yaml",
    "write_export",
]
