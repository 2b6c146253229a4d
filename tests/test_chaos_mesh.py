"""``python -m faults export --chaos-mesh`` (faults/chaos_mesh/): a schedule
as Chaos Mesh manifests.

The expectations are written by hand here from Chaos Mesh's API (v2.8.3,
api/v1alpha1/*_types.go), not derived from the code: a small schedule's
whole Workflow and its standalone objects, each kind's spec, the durations
from inject to heal, and the faults left out. Everything the export writes
is also validated against the CRDs' openAPIV3Schema (a copy of the parts
needed: tests/data/chaos_mesh_crds_v2.8.3.json, which names its source) by
a small schema walk, plus the admission-webhook rules a CRD schema cannot
say (api/v1alpha1/*_webhook.go). No cluster: nothing here was applied to
Kubernetes. The Kubernetes example (docs/examples/kubernetes/) is checked
as far as it can be without one: its target file parses, its hooks expand
to the kubectl calls meant (against a stub kubectl), and its example
schedule exports as its README shows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import require_component

from faults.catalogue import REGISTRY
from faults.chaos_mesh import (
    Exported,
    ExportError,
    LeftOut,
    Options,
    constructor_defaults,
    default_run_id,
    export,
    held_faults,
    map_fault,
    read_schedule_file,
    to_yaml,
)
from faults.schedule import FaultChoice, Step, plan_schedule
from runs.explore import load_schedule

REPO = Path(__file__).resolve().parents[1]
CRDS = json.loads((REPO / "tests/data/chaos_mesh_crds_v2.8.3.json").read_text())
SCHEMAS: dict[str, Any] = CRDS["schemas"]
DEFAULTS = constructor_defaults(REGISTRY)
API = "chaos-mesh.org/v1alpha1"
MANAGED = "app.kubernetes.io/managed-by"


def sel(labels: dict[str, str], mode: str, ns: str = "llm", **extra: str) -> dict[str, Any]:
    """A PodSelector as Chaos Mesh spells it (api/v1alpha1/selector.go)."""
    return {"selector": {"namespaces": [ns], "labelSelectors": labels}, "mode": mode, **extra}


REPLICAS = {"app": "vllm"}
R0 = {"app": "vllm", "replica": "0"}
R1 = {"app": "vllm", "replica": "1"}
ROUTER = {"app": "vllm-router"}
OPTS = Options(namespace="llm", selector=REPLICAS,
               nodes={"replica-0": R0, "replica-1": R1, "router": ROUTER},
               run_id="tiny", source="tiny.json", defaults=DEFAULTS)


def steps(*faults: tuple[float, float, str, str, dict[str, Any]]) -> list[Step]:
    """(inject at, heal at, kind, target, params) -> inject and heal steps."""
    out = []
    for key, (at, heal, kind, target, params) in enumerate(faults):
        out += [Step(at, "inject", kind, target, key, params),
                Step(heal, "heal", kind, target, key, params)]
    return sorted(out, key=lambda s: s.at_s)


def with_opts(**kw: Any) -> Options:
    return Options(**{**OPTS.__dict__, **kw})


def one(kind: str, target: str, params: dict[str, Any] | None = None,
        **opts: Any) -> Exported | LeftOut:
    """One fault held from 1 s to 3 s, mapped."""
    [h] = held_faults(steps((1.0, 3.0, kind, target, params or {})))
    return map_fault(h, with_opts(**opts))


def spec_of(kind: str, target: str, params: dict[str, Any] | None = None,
            **opts: Any) -> tuple[str, dict[str, Any]]:
    r = one(kind, target, params, **opts)
    assert isinstance(r, Exported), getattr(r, "reason", r)
    [c] = r.chaos
    return c.crd, c.spec


def reason(kind: str, target: str, params: dict[str, Any] | None = None, **opts: Any) -> str:
    r = one(kind, target, params, **opts)
    assert isinstance(r, LeftOut), r
    return r.reason


# ------------------------------------------------ a small schedule, by hand

TINY = steps(
    (5.0, 15.0, "network_partition", "replica-0", {"mode": "drop"}),
    (20.5, 32.75, "network_latency", "router-replica-1", {"latency_ms": 150, "jitter_ms": 50}),
    (40.0, 50.0, "process_pause", "one", {}),
    (60.0, 70.0, "process_kill", "one", {}),
)
LABELS = {MANAGED: "ordeal", "ordeal/run-id": "tiny"}
PARTITION_R0 = {**sel(R0, "all"), "action": "partition", "direction": "both"}
LATENCY_R1 = {**sel(ROUTER, "all"), "action": "delay",
              "delay": {"latency": "150ms", "jitter": "50ms"},
              "direction": "from", "target": sel(R1, "all")}
KILL_ONE = {**sel(REPLICAS, "one"), "action": "pod-kill", "gracePeriod": 0}
TINY_WORKFLOW = {
    "apiVersion": API, "kind": "Workflow",
    "metadata": {"name": "ordeal-tiny", "namespace": "llm", "labels": LABELS,
                 "annotations": {"ordeal/source": "tiny.json"}},
    "spec": {"entry": "ordeal-schedule", "templates": [
        {"name": "ordeal-schedule", "templateType": "Serial",
         "children": ["wait-f0", "f0-network-partition", "wait-f1", "f1-network-latency",
                      "wait-f3", "f3-process-kill"]},
        {"name": "wait-f0", "templateType": "Suspend", "deadline": "5s"},
        {"name": "f0-network-partition", "templateType": "NetworkChaos", "deadline": "10s",
         "networkChaos": PARTITION_R0},
        {"name": "wait-f1", "templateType": "Suspend", "deadline": "5500ms"},  # 20.5 - 15
        {"name": "f1-network-latency", "templateType": "NetworkChaos",
         "deadline": "12250ms", "networkChaos": LATENCY_R1},  # 32.75 - 20.5
        # f2 (process_pause) is not exported: its time stays quiet time.
        {"name": "wait-f3", "templateType": "Suspend", "deadline": "27250ms"},  # 60 - 32.75
        {"name": "f3-process-kill", "templateType": "PodChaos", "deadline": "10s",
         "podChaos": KILL_ONE},
    ]},
}


def standalone_meta(n: int, kind: str, at: str, hold: str, suffix: str = "") -> dict[str, Any]:
    return {"name": f"ordeal-tiny-f{n}{suffix}", "namespace": "llm",
            "labels": {**LABELS, "ordeal/step": f"f{n}", "ordeal/kind": kind},
            "annotations": {"ordeal/at-s": at, "ordeal/hold-s": hold,
                            "ordeal/source": "tiny.json"}}


TINY_OBJECTS = {
    "f00-network-partition-replica-0": {
        "apiVersion": API, "kind": "NetworkChaos",
        "metadata": standalone_meta(0, "network_partition", "5", "10"),
        "spec": {**PARTITION_R0, "duration": "10s"}},
    "f01-network-latency-router-replica-1": {
        "apiVersion": API, "kind": "NetworkChaos",
        "metadata": standalone_meta(1, "network_latency", "20.5", "12.25"),
        "spec": {**LATENCY_R1, "duration": "12250ms"}},
    # pod-kill is one-shot: no duration (it would mean nothing).
    "f03-process-kill-one": {
        "apiVersion": API, "kind": "PodChaos",
        "metadata": standalone_meta(3, "process_kill", "60", "10"),
        "spec": KILL_ONE},
}


def test_a_small_schedule_gives_the_workflow_and_objects_written_by_hand():
    x = export(TINY, OPTS)
    assert x.workflow == TINY_WORKFLOW
    assert dict(x.objects) == TINY_OBJECTS
    assert [e.held.kind for e in x.exported] == ["network_partition", "network_latency",
                                                 "process_kill"]
    [left] = x.left_out
    assert (left.held.label, left.held.kind, left.held.at_s, left.held.hold_s) == (
        "f2", "process_pause", 40.0, 10.0)
    assert "cannot pause a process" in left.reason and "SIGSTOP" in left.reason


def test_holds_run_from_each_inject_to_its_own_heal():
    # Keys pair injects with heals, whatever the order of the steps in between.
    s = [Step(1.0, "inject", "packet_loss", "one", 7, {}),
         Step(2.5, "inject", "clock_drift", "one", 3, {}),
         Step(4.25, "heal", "packet_loss", "one", 7, {}),
         Step(9.0, "heal", "clock_drift", "one", 3, {})]
    held = held_faults(s)
    assert [(h.label, h.key, h.at_s, h.hold_s, h.heal_s) for h in held] == [
        ("f0", 7, 1.0, 3.25, 4.25), ("f1", 3, 2.5, 6.5, 9.0)]


def test_overlapping_faults_run_as_parallel_branches_each_waiting_its_own_time():
    x = export(steps((1.0, 11.0, "network_partition", "replica-0", {}),
                     (6.0, 9.0, "packet_loss", "replica-1", {"probability": 0.25})), OPTS)
    t = x.workflow["spec"]["templates"]
    assert t[0] == {"name": "ordeal-schedule", "templateType": "Parallel",
                    "children": ["at-f0", "at-f1"]}
    assert {x["name"]: x for x in t[1:]} == {
        "at-f0": {"name": "at-f0", "templateType": "Serial",
                  "children": ["wait-f0", "f0-network-partition"]},
        "wait-f0": {"name": "wait-f0", "templateType": "Suspend", "deadline": "1s"},
        "f0-network-partition": {"name": "f0-network-partition", "templateType": "NetworkChaos",
                                 "deadline": "10s", "networkChaos": PARTITION_R0},
        "at-f1": {"name": "at-f1", "templateType": "Serial",
                  "children": ["wait-f1", "f1-packet-loss"]},
        "wait-f1": {"name": "wait-f1", "templateType": "Suspend", "deadline": "6s"},
        "f1-packet-loss": {"name": "f1-packet-loss", "templateType": "NetworkChaos",
                           "deadline": "3s", "networkChaos": {
                               **sel(R1, "all"), "action": "loss", "loss": {"loss": "25"}}},
    }


def test_a_fault_at_time_zero_has_no_wait_and_a_list_of_nodes_runs_together():
    x = export(steps((0.0, 2.0, "network_partition", "replica-0,replica-1", {})), OPTS)
    t = {x["name"]: x for x in x.workflow["spec"]["templates"]}
    assert t["ordeal-schedule"]["children"] == ["f0-network-partition"]
    assert t["f0-network-partition"] == {
        "name": "f0-network-partition", "templateType": "Parallel",
        "children": ["f0-network-partition-0", "f0-network-partition-1"]}
    assert t["f0-network-partition-1"]["networkChaos"] == {
        **sel(R1, "all"), "action": "partition", "direction": "both"}
    assert [(stem, o["metadata"]["name"]) for stem, o in x.objects] == [
        ("f00-network-partition-replica-0", "ordeal-tiny-f0-0"),
        ("f00-network-partition-replica-1", "ordeal-tiny-f0-1")]


# ------------------------------------------------------------ each kind

@pytest.mark.parametrize("kind,target,params,opts,crd,spec", [
    ("network_partition", "one", {}, {}, "NetworkChaos",
     {**sel(REPLICAS, "one"), "action": "partition", "direction": "both"}),
    ("network_partition", "all", {"mode": "drop"}, {}, "NetworkChaos",
     {**sel(REPLICAS, "all"), "action": "partition", "direction": "both"}),
    # Ordeal's counts (faults.targets.select): minority of 5 = 2, majority = 3.
    ("network_partition", "minority", {}, {"replicas": 5}, "NetworkChaos",
     {**sel(REPLICAS, "fixed", value="2"), "action": "partition", "direction": "both"}),
    ("network_partition", "majority", {}, {"replicas": 5}, "NetworkChaos",
     {**sel(REPLICAS, "fixed", value="3"), "action": "partition", "direction": "both"}),
    ("network_partition", "minority", {}, {"replicas": 2}, "NetworkChaos",
     {**sel(REPLICAS, "fixed", value="1"), "action": "partition", "direction": "both"}),
    ("packet_loss", "one", {"probability": 0.1}, {}, "NetworkChaos",
     {**sel(REPLICAS, "one"), "action": "loss", "loss": {"loss": "10"}}),
    ("packet_loss", "replica-0", {"probability": 0.125}, {}, "NetworkChaos",
     {**sel(R0, "all"), "action": "loss", "loss": {"loss": "12.5"}}),
    # Default latency_ms=100, jitter 0 left out (Chaos Mesh's default "0ms").
    ("network_latency", "router-replica-0", {}, {}, "NetworkChaos",
     {**sel(ROUTER, "all"), "action": "delay", "delay": {"latency": "100ms"},
      "direction": "from", "target": sel(R0, "all")}),
    ("network_latency", "router-replica-0", {"latency_ms": 20.5, "direction": "upstream"}, {},
     "NetworkChaos", {**sel(ROUTER, "all"), "action": "delay", "delay": {"latency": "20.5ms"},
                      "direction": "to", "target": sel(R0, "all")}),
    ("network_latency", "router-replica-0", {"direction": "both"}, {}, "NetworkChaos",
     {**sel(ROUTER, "all"), "action": "delay", "delay": {"latency": "100ms"},
      "direction": "both", "target": sel(R0, "all")}),
    ("network_latency", "client-router", {"latency_ms": 200},
     {"client_cidrs": ("192.0.2.10/32",)}, "NetworkChaos",
     {**sel(ROUTER, "all"), "action": "delay", "delay": {"latency": "200ms"},
      "direction": "to", "externalTargets": ["192.0.2.10/32"]}),
    ("bandwidth_limit", "router-replica-0", {"rate_kbps": 64, "direction": "downstream"}, {},
     "NetworkChaos", {**sel(ROUTER, "all"), "action": "bandwidth",
                      "bandwidth": {"rate": "64kbps", "limit": 20971520, "buffer": 10000},
                      "direction": "from", "target": sel(R0, "all")}),
    # 0.5 kB/s = 500 bytes/s: Chaos Mesh's rate is a whole number.
    ("bandwidth_limit", "router-replica-1", {"rate_kbps": 0.5}, {}, "NetworkChaos",
     {**sel(ROUTER, "all"), "action": "bandwidth",
      "bandwidth": {"rate": "500bps", "limit": 20971520, "buffer": 10000},
      "direction": "from", "target": sel(R1, "all")}),
    ("connection_reset", "router-replica-0", {"timeout_ms": 0}, {}, "HTTPChaos",
     {**sel(R0, "all"), "target": "Response", "port": 8000, "abort": True}),
    ("connection_reset", "router-replica-1", {"direction": "upstream"}, {"http_port": 8080},
     "HTTPChaos", {**sel(R1, "all"), "target": "Request", "port": 8080, "abort": True}),
    ("connection_reset", "client-router", {}, {"router_http_port": 8001}, "HTTPChaos",
     {**sel(ROUTER, "all"), "target": "Response", "port": 8001, "abort": True}),
    ("http_fault", "router-replica-0", {"mode": "abort", "status": 502}, {}, "HTTPChaos",
     {**sel(R0, "all"), "target": "Response", "port": 8000, "replace": {
         "code": 502, "headers": {"Content-Type": "application/json"},
         "body": base64.b64encode(
             b'{"error": {"object": "error", "type": "ordeal_fault", "code": 502, '
             b'"message": "ordeal http_fault (Chaos Mesh): injected HTTP 502"}}').decode()}}),
    ("http_fault", "router-replica-0", {"body": "busy"}, {}, "HTTPChaos",
     {**sel(R0, "all"), "target": "Response", "port": 8000, "replace": {
         "code": 503, "headers": {"Content-Type": "application/json"}, "body": "YnVzeQ=="}}),
    ("http_fault", "router-replica-1", {"mode": "delay_head", "delay_ms": 2500}, {},
     "HTTPChaos", {**sel(R1, "all"), "target": "Response", "port": 8000, "delay": "2500ms"}),
    ("clock_drift", "one", {"mode": "offset", "offset_s": 3600}, {}, "TimeChaos",
     {**sel(REPLICAS, "one"), "timeOffset": "3600s", "clockIds": ["CLOCK_REALTIME"]}),
    ("clock_drift", "replica-1", {"offset_s": -90.5}, {"container": "engine"}, "TimeChaos",
     {**sel(R1, "all"), "containerNames": ["engine"], "timeOffset": "-90500ms",
      "clockIds": ["CLOCK_REALTIME"]}),
    ("process_kill", "replica-0", {"restart": True, "ready_timeout_s": 900}, {}, "PodChaos",
     {**sel(R0, "all"), "action": "pod-kill", "gracePeriod": 0}),
    ("process_kill", "one", {}, {"kill": "container-kill", "container": "vllm"}, "PodChaos",
     {**sel(REPLICAS, "one"), "action": "container-kill", "containerNames": ["vllm"]}),
    ("gpu_memory_pressure", "one", {"backend": "cpu", "mb": 512}, {}, "StressChaos",
     {**sel(REPLICAS, "one"), "stressors": {"memory": {"workers": 1, "size": "512MiB"}}}),
])
def test_each_kind_maps_to_the_chaos_mesh_spec_written_by_hand(kind, target, params, opts,
                                                               crd, spec):
    assert spec_of(kind, target, params, **opts) == (crd, spec)


@pytest.mark.parametrize("kind,target,params,opts,why", [
    ("process_pause", "one", {}, {}, "cannot pause a process in a pod"),
    ("gpu_throttle", "one", {}, {}, "no GPU stressor"),
    ("lsn_jump", "router-replica-0", {}, {}, "server-sent events"),
    ("ray_node_loss", "one", {}, {}, "Ray-only"),
    ("ray_node_pause", "one", {}, {}, "Ray-only"),
    ("ray_node_partition", "one", {}, {}, "Ray-only"),
    ("disk_full", "one", {}, {}, "unknown fault kind 'disk_full'"),
    ("network_partition", "one", {"mode": "reject"}, {}, "partition drops packets"),
    ("network_partition", "one", {"foo": 1}, {}, "parameter(s) foo"),
    ("clock_drift", "one", {"mode": "drift"}, {}, "fixed offset only"),
    ("clock_drift", "one", {"mode": "strobe"}, {}, "fixed offset only"),
    ("connection_reset", "router-replica-0", {"timeout_ms": 500}, {}, "mid-stream"),
    ("connection_reset", "router-replica-0", {"after_bytes": 64}, {}, "mid-stream"),
    ("http_fault", "router-replica-0", {"mode": "truncate"}, {}, "inside a response stream"),
    ("http_fault", "router-replica-0", {"mode": "error_event"}, {}, "inside a response stream"),
    ("http_fault", "router-replica-0", {"mode": "malformed"}, {}, "inside a response stream"),
    ("network_latency", "router-replica-0", {"toxicity": 0.5}, {}, "toxicity=0.5"),
    ("bandwidth_limit", "router-replica-0", {"slice_average_size": 64}, {}, "slicer"),
    ("process_kill", "one", {"restart": False}, {}, "restart=false"),
    ("process_kill", "one", {"scope": "engine_core"}, {}, "scope 'engine_core'"),
    ("gpu_memory_pressure", "one", {"mb": 512}, {}, "no GPU memory stressor"),
    ("network_latency", "one", {}, {}, "picks among the fault proxy's links"),
    ("network_latency", "replica-0", {}, {}, "'replica-0' is not a link"),
    ("network_partition", "replica-3", {}, {}, "--node replica-3=KEY=VALUE"),
    ("network_latency", "router-replica-3", {}, {}, "--node replica-3="),
    ("network_partition", "one", {}, {"selector": {}}, "give --selector"),
    ("network_partition", "majority", {}, {}, "give --replicas N"),
    ("network_latency", "client-router", {}, {}, "give --client-cidr"),
    ("network_latency", "client-router", {"direction": "upstream"},
     {"client_cidrs": ("10.0.0.0/8",)}, "use direction downstream"),
])
def test_faults_without_an_equivalent_are_left_out_with_the_reason(kind, target, params, opts,
                                                                   why):
    assert why in reason(kind, target, params, **opts)


def test_a_schedule_with_nothing_to_export_has_no_workflow():
    x = export(steps((1.0, 2.0, "process_pause", "one", {}),
                     (3.0, 4.0, "lsn_jump", "router-replica-0", {})), OPTS)
    assert x.workflow is None and x.objects == [] and len(x.left_out) == 2


@pytest.mark.parametrize("kw,message", [
    ({"namespace": "LLM"}, "--namespace 'LLM'"),
    ({"run_id": "Run_1"}, "--run-id 'Run_1'"),
    ({"run_id": "x" * 31}, "--run-id"),
    ({"selector": {"app": "bad value"}}, "--selector: label app=bad value"),
    ({"nodes": {"router": {"-x": "y"}}}, "--node router: label -x=y"),
    ({"kill": "container-kill"}, "needs --container NAME"),
    ({"http_port": 0}, "--http-port 0"),
    ({"client_cidrs": ("somewhere",)}, "--client-cidr 'somewhere'"),
    ({"replicas": 0}, "--replicas 0"),
])
def test_options_kubernetes_would_refuse_are_refused_first(kw, message):
    with pytest.raises(ExportError, match=re.escape(message)):
        export(TINY, with_opts(**kw))


def test_the_default_run_id_is_the_file_stem_and_its_hash(tmp_path):
    text = b'{"format": "ordeal-schedule"}'
    # sha256 of those bytes, computed apart: its first 8 hex digits.
    assert default_run_id(Path("reports/runs/x/minimal-schedule.json"), text) == \
        "minimal-schedule-" + hashlib.sha256(text).hexdigest()[:8]
    assert default_run_id(Path("A_Very.Long Schedule Name For Tests.json"), b"") == \
        "a-very-long-schedule-e3b0c442"


# ------------------------------------------------------------ schedule files

def write_schedule(path: Path, s: list[Step], fmt: str = "ordeal-schedule") -> Path:
    path.write_text(json.dumps({"format": fmt, "version": 1,
                                "steps": [x.to_dict() for x in s]}))
    return path


ONE_STEP = '{"format": "ordeal-schedule", "version": 1, "steps": [{%s}]}'


@pytest.mark.parametrize("text,message", [
    ("{not json", "not JSON"),
    ('[1, 2]', "not an Ordeal schedule"),
    ('{"format": "ordeal-history", "version": 1}', "\"format\" is 'ordeal-history'"),
    ('{"format": "ordeal-schedule", "version": 2, "steps": []}', "version 2"),
    ('{"format": "ordeal-schedule", "version": 1}', "field 'steps' is missing"),
    ('{"format": "ordeal-schedule", "version": 1, "steps": []}', "has no steps"),
    (ONE_STEP % '"at_s": 1, "action": "inject", "kind": "packet_loss", "target": "one"',
     "steps[0]: missing field 'key'"),
    (ONE_STEP % '"at_s": "1", "action": "inject", "kind": "packet_loss", "target": "one", '
                '"key": 0', "field 'at_s' is '1'"),
    (ONE_STEP % '"at_s": 1, "action": "inject", "kind": "packet_loss", "target": "one", "key": 0',
     "never healed"),
    (ONE_STEP % '"at_s": 1, "action": "heal", "kind": "packet_loss", "target": "one", "key": 0',
     "without an earlier inject"),
    (ONE_STEP % '"at_s": 1, "action": "pause", "kind": "packet_loss", "target": "one", "key": 0',
     "action 'pause'"),
])
def test_a_bad_schedule_file_says_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(ExportError, match=re.escape(message)) as e:
        read_schedule_file(path)
    assert str(path) in str(e.value)


def test_schedule_files_of_explorations_and_endurance_runs_are_read(tmp_path):
    assert read_schedule_file(write_schedule(tmp_path / "a.json", TINY)) == TINY
    assert read_schedule_file(write_schedule(tmp_path / "endurance.json", TINY,
                                             "ordeal-endurance")) == TINY
    example = read_schedule_file(REPO / "docs/examples/engine-pause-health-lie.json")
    assert [(s.action, s.kind, s.at_s) for s in example] == [
        ("inject", "process_pause", 2.013), ("heal", "process_pause", 12.014)]


# ------------------------------------------------ validation against the CRDs

GO_DURATION = re.compile(r"-?([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
INT32 = (-2**31, 2**31 - 1)
INT64 = (-2**63, 2**63 - 1)


def schema_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The structural-schema checks the API server makes: types, required
    fields, enums, patterns, bounds and formats; a field the schema does not
    know is an error too (the API server would drop it without a word)."""
    errs: list[str] = []
    where = path or "."
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{where}: {value!r} not in {schema['enum']}")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            errs.append(f"{where}: {value!r} is not an int or a string")
        return errs
    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        for req in schema.get("required", []):
            if req not in value:
                errs.append(f"{where}: required field {req!r} missing")
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for k, v in value.items():
            if props is not None and k in props:
                errs += schema_errors(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                errs += schema_errors(v, extra, f"{path}.{k}")
            elif props is not None or extra is False:
                errs.append(f"{where}: unknown field {k!r}")
    elif t == "array":
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not an array"]
        for i, v in enumerate(value):
            errs += schema_errors(v, schema.get("items", {}), f"{path}[{i}]")
    elif t == "string":
        if not isinstance(value, str):
            return [f"{where}: {value!r} is not a string"]
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errs.append(f"{where}: {value!r} does not match {schema['pattern']}")
        if schema.get("format") == "byte":
            try:
                base64.b64decode(value, validate=True)
            except binascii.Error:
                errs.append(f"{where}: {value!r} is not base64 (format byte)")
    elif t == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{where}: {value!r} is not an integer"]
        lo, hi = {"int32": INT32, "int64": INT64}.get(schema.get("format", ""), (None, None))
        if lo is not None and not lo <= value <= hi:
            errs.append(f"{where}: {value} out of {schema['format']}")
        if "minimum" in schema and value < schema["minimum"]:
            errs.append(f"{where}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errs.append(f"{where}: {value} > maximum {schema['maximum']}")
    elif t == "boolean" and not isinstance(value, bool):
        errs.append(f"{where}: {value!r} is not a boolean")
    elif t == "number" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        errs.append(f"{where}: {value!r} is not a number")
    return errs


def label_errors(labels: dict[str, str], where: str) -> list[str]:
    errs = []
    for k, v in labels.items():
        prefix, _, name = k.rpartition("/")
        if prefix and not all(DNS_LABEL.fullmatch(p) for p in prefix.split(".")):
            errs.append(f"{where}: label key prefix {prefix!r}")
        if not LABEL_NAME.fullmatch(name) or len(name) > 63:
            errs.append(f"{where}: label key {k!r}")
        if v and (not LABEL_NAME.fullmatch(v) or len(v) > 63):
            errs.append(f"{where}: label value {v!r}")
    return errs


def webhook_errors(crd: str, spec: dict[str, Any], where: str, in_workflow: bool) -> list[str]:
    """The admission webhook's rules for the fields the export writes
    (api/v1alpha1/{workflow,networkchaos,podchaos,httpchaos,stresschaos,
    common}_webhook.go and timechaos_webhook.go, v2.8.3)."""
    errs = []
    if in_workflow and "duration" in spec:
        errs.append(f"{where}: duration inside a Workflow (use the template's deadline)")
    if not in_workflow and "duration" in spec and not GO_DURATION.fullmatch(spec["duration"]):
        errs.append(f"{where}: duration {spec['duration']!r}")
    for selector in [spec, spec.get("target")] if crd == "NetworkChaos" else [spec]:
        if isinstance(selector, dict) and selector.get("mode") == "fixed" and (
                not selector.get("value", "").isdigit() or int(selector["value"]) < 1):
            errs.append(f"{where}: mode fixed needs a positive value")
        if isinstance(selector, dict) and "selector" in selector:
            errs += label_errors(selector["selector"].get("labelSelectors", {}), where)
    if crd == "NetworkChaos" and spec["action"] != "partition":
        if spec.get("direction") in ("from", "both") and "externalTargets" in spec:
            errs.append(f"{where}: external targets with direction {spec['direction']}")
        if spec.get("direction") in ("from", "both") and "target" not in spec:
            errs.append(f"{where}: direction {spec['direction']} without a target")
    if crd == "NetworkChaos" and "loss" in spec:
        float(spec["loss"]["loss"])  # FloatStr
    if crd == "NetworkChaos" and "bandwidth" in spec and not re.fullmatch(
            r"[0-9]+(kbit|mbit|gbit|tbit|tbps|gbps|mbps|kbps|bps|bit)", spec["bandwidth"]["rate"]):
        errs.append(f"{where}: rate {spec['bandwidth']['rate']!r}")
    if crd == "PodChaos" and spec["action"] == "container-kill" and not spec.get("containerNames"):
        errs.append(f"{where}: container-kill without containerNames")
    if crd == "HTTPChaos":
        if not spec.get("port", 0) > 0:
            errs.append(f"{where}: port must be > 0")
        if "delay" in spec and not GO_DURATION.fullmatch(spec["delay"]):
            errs.append(f"{where}: delay {spec['delay']!r}")
    if crd == "TimeChaos" and not GO_DURATION.fullmatch(spec["timeOffset"]):
        errs.append(f"{where}: timeOffset {spec['timeOffset']!r}")
    if crd == "StressChaos":
        memory = spec["stressors"]["memory"]
        if memory["workers"] <= 0 or not re.fullmatch(r"[0-9]+(\.[0-9]+)? ?[kKmMgGtTpP]?[iI]?[bB]?",
                                                       memory["size"]):
            errs.append(f"{where}: memory stressor {memory}")
    return errs


def object_errors(obj: dict[str, Any]) -> list[str]:
    """Every problem the API server (CRD schema) or Chaos Mesh's webhook
    would find in one object the export wrote."""
    kind = obj.get("kind")
    if kind not in SCHEMAS or obj.get("apiVersion") != API:
        return [f"{obj.get('apiVersion')}/{kind}: not a checked CRD"]
    meta = obj["metadata"]
    errs = schema_errors(obj, SCHEMAS[kind], kind)
    if not DNS_LABEL.fullmatch(meta["name"]) or len(meta["name"]) > 63:
        errs.append(f"{kind}: name {meta['name']!r}")
    if not DNS_LABEL.fullmatch(meta["namespace"]):
        errs.append(f"{kind}: namespace {meta['namespace']!r}")
    errs += label_errors(meta.get("labels", {}), f"{kind} {meta['name']}")
    if kind != "Workflow":
        return errs + webhook_errors(kind, obj["spec"], meta["name"], in_workflow=False)
    templates = obj["spec"]["templates"]
    names = [t["name"] for t in templates]
    if len(set(names)) != len(names):
        errs.append(f"duplicate template names {names}")
    if obj["spec"]["entry"] not in names:
        errs.append(f"entry {obj['spec']['entry']!r} is no template")
    embeds = {"NetworkChaos": "networkChaos", "PodChaos": "podChaos", "TimeChaos": "timeChaos",
              "StressChaos": "stressChaos", "HTTPChaos": "httpChaos"}
    for t in templates:
        where, tt = f"template {t['name']}", t["templateType"]
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", t["name"]) or len(t["name"]) > 63:
            errs.append(f"{where}: not a DNS-1123 name")
        if "deadline" in t and not GO_DURATION.fullmatch(t["deadline"]):
            errs.append(f"{where}: deadline {t['deadline']!r}")
        chaos_fields = [k for k in t if k in embeds.values()]
        if tt == "Suspend":
            if not t.get("deadline") or chaos_fields or t.get("children"):
                errs.append(f"{where}: a Suspend has a deadline and nothing else")
        elif tt in ("Serial", "Parallel"):
            if chaos_fields or not t.get("children"):
                errs.append(f"{where}: {tt} without children or with a chaos")
            errs += [f"{where}: child {c!r} is no template" for c in t["children"]
                     if c not in names]
        elif tt in embeds:
            if chaos_fields != [embeds[tt]] or t.get("children"):
                errs.append(f"{where}: a {tt} template carries exactly {embeds[tt]}")
            if not t.get("deadline"):
                errs.append(f"{where}: a chaos in a Serial without a deadline never ends")
            errs += webhook_errors(tt, t[embeds[tt]], where, in_workflow=True)
        else:
            errs.append(f"{where}: templateType {tt!r}")
    return errs


EVERY_KIND = steps(
    (2.0, 5.0, "network_partition", "one", {}),
    (6.0, 8.0, "network_partition", "minority", {}),
    (9.0, 12.5, "packet_loss", "replica-0,replica-1", {"probability": 0.05}),
    (13.0, 14.0, "network_latency", "router-replica-0", {"latency_ms": 150, "jitter_ms": 50}),
    (15.0, 16.0, "network_latency", "client-router", {"latency_ms": 80}),
    (17.0, 18.0, "bandwidth_limit", "router-replica-1", {"rate_kbps": 64,
                                                         "direction": "both"}),
    (19.0, 20.0, "connection_reset", "router-replica-0", {"timeout_ms": 0}),
    (21.0, 22.0, "http_fault", "router-replica-0", {"mode": "abort", "status": 503}),
    (23.0, 24.0, "http_fault", "client-router", {"mode": "delay_head", "delay_ms": 1000}),
    (25.0, 26.0, "clock_drift", "one", {"mode": "offset", "offset_s": -3600}),
    (27.0, 28.0, "process_kill", "replica-1", {}),
    (29.0, 30.0, "gpu_memory_pressure", "all", {"backend": "cpu", "mb": 1024}),
    (31.0, 32.0, "process_pause", "one", {}),
)
FULL = with_opts(replicas=3, client_cidrs=("192.0.2.0/24",), container="vllm")


@pytest.mark.parametrize("schedule,opts", [
    (EVERY_KIND, FULL),
    (EVERY_KIND, with_opts(replicas=3, client_cidrs=("192.0.2.7",), container="vllm",
                           kill="container-kill", namespace="default")),
    (TINY, OPTS),
    # Overlapping faults (the Parallel form), and a plain seeded schedule.
    (steps((1.0, 30.0, "network_partition", "replica-0", {}),
           (2.0, 3.0, "http_fault", "router-replica-1", {}),
           (2.5, 40.0, "clock_drift", "replica-1", {})), OPTS),
    (plan_schedule([FaultChoice("network_partition", "one"),
                    FaultChoice("network_latency", "router-replica-0", {"latency_ms": 150}),
                    FaultChoice("process_kill", "one")], 600, 7), OPTS),
])
def test_every_object_passes_the_crd_schema_and_the_webhook_rules(schedule, opts):
    x = export(schedule, opts)
    assert x.exported and x.workflow is not None
    docs = [x.workflow, *(o for _, o in x.objects)]
    assert {d["kind"] for d in docs} <= set(SCHEMAS)
    for doc in docs:
        assert object_errors(doc) == [], doc["metadata"]["name"]
    if schedule is EVERY_KIND:
        assert {d["kind"] for d in docs} == set(SCHEMAS)  # every CRD met at least once
        assert [e.held.kind for e in x.left_out] == ["process_pause"]


def test_the_schema_walk_catches_what_kubernetes_would_refuse():
    good = dict(export(TINY, OPTS).objects)["f00-network-partition-replica-0"]
    assert object_errors(good) == []
    bad_mode = json.loads(json.dumps(good))
    bad_mode["spec"]["mode"] = "some"
    no_selector = json.loads(json.dumps(good))
    del no_selector["spec"]["selector"]
    unknown = json.loads(json.dumps(good))
    unknown["spec"]["probability"] = 0.1
    bad_rate = json.loads(json.dumps(good))
    bad_rate["spec"].update(action="bandwidth", bandwidth={"rate": "1.5kbps", "limit": 0,
                                                           "buffer": 1})
    assert any("'some' not in" in e for e in object_errors(bad_mode))
    assert any("required field 'selector'" in e for e in object_errors(no_selector))
    assert any("unknown field 'probability'" in e for e in object_errors(unknown))
    assert any("minimum 1" in e for e in object_errors(bad_rate))
    assert any("rate '1.5kbps'" in e for e in object_errors(bad_rate))
    wf = json.loads(json.dumps(export(TINY, OPTS).workflow))
    wf["spec"]["templates"][2]["networkChaos"]["duration"] = "10s"
    wf["spec"]["templates"][1].pop("deadline")
    errs = object_errors(wf)
    assert any("duration inside a Workflow" in e for e in errs)
    assert any("Suspend has a deadline" in e for e in errs)


def test_the_crd_copy_names_its_source():
    assert CRDS["repository"] == "github.com/chaos-mesh/chaos-mesh" and CRDS["tag"] == "v2.8.3"
    assert set(CRDS["sources"]) == set(SCHEMAS)
    assert SCHEMAS["PodChaos"]["properties"]["spec"]["properties"]["action"]["enum"] == [
        "pod-kill", "pod-failure", "container-kill"]


# ------------------------------------------------------------------ YAML

def test_yaml_is_block_style_and_quotes_what_yaml_would_misread():
    doc = {"a": "150ms", "b": "0", "c": "yes", "d": "app.kubernetes.io/name", "e": [], "f": {},
           "g": [1, {"x": True, "y": None}, [2]], "h": "\u00e9\u2028", "i": 'say "hi"',
           "j": 2.5, "k": "a: b", "l": "-1", "m": "Off"}
    assert to_yaml(doc) == (
        'a: "150ms"\n'
        'b: "0"\n'
        'c: "yes"\n'
        'd: app.kubernetes.io/name\n'
        'e: []\n'
        'f: {}\n'
        'g:\n'
        '  - 1\n'
        '  - x: true\n'
        '    "y": null\n'  # y is a boolean to YAML 1.1 (go-yaml v2 in kubectl)
        '  - - 2\n'
        'h: "\\xe9\\u2028"\n'
        'i: "say \\"hi\\""\n'
        'j: 2.5\n'
        'k: "a: b"\n'
        'l: "-1"\n'
        'm: "Off"\n')


def pyyaml():
    """PyYAML, the independent reader of what the export writes: it comes into
    the venv with vLLM (.ci/setup), so under CI its absence fails the test."""
    try:
        import yaml
    except ImportError as e:
        require_component("PyYAML", f"{e} (pip install pyyaml)")
    return yaml


def test_yaml_reads_back_as_the_same_objects():
    yaml = pyyaml()
    x = export(EVERY_KIND, FULL)
    for doc in [x.workflow, *(o for _, o in x.objects)]:
        assert yaml.safe_load(to_yaml(doc)) == doc


# ------------------------------------------------------------------ the CLI

def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "faults", "export", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


NODE_ARGS = ["--namespace", "llm", "--selector", "app=vllm",
             "--node", "replica-0=app=vllm,replica=0", "--node", "replica-1=app=vllm,replica=1",
             "--node", "router=app=vllm-router"]


def test_cli_a_bad_schedule_file_exits_2_and_says_what_to_do(tmp_path):
    (tmp_path / "broken.json").write_text("{oops")
    done = cli("--chaos-mesh", "broken.json", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: broken.json: not JSON" in done.stderr
    assert "minimal-schedule.json" in done.stderr  # what a schedule file is
    write_schedule(tmp_path / "open.json", TINY[:1])
    done = cli("--chaos-mesh", "open.json", cwd=tmp_path)
    assert done.returncode == 2 and "never healed" in done.stderr, done.stderr
    done = cli("--chaos-mesh", "missing.json", cwd=tmp_path)
    assert done.returncode == 2 and "cannot read the schedule file" in done.stderr
    done = cli("--chaos-mesh", "open.json", "--node", "replica-0", cwd=tmp_path)
    assert done.returncode == 2 and "--node 'replica-0': expected NAME=KEY=VALUE" in done.stderr
    done = cli("open.json", cwd=tmp_path)  # --chaos-mesh is required
    assert done.returncode == 2 and "--chaos-mesh" in done.stderr
    assert not list(tmp_path.glob("chaos-mesh-*"))  # nothing written


def test_cli_writes_the_manifests_progress_and_summary(tmp_path):
    write_schedule(tmp_path / "tiny.json", TINY)
    done = cli("--chaos-mesh", "tiny.json", *NODE_ARGS, "--run-id", "tiny", "--format", "json",
               "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    assert json.loads((out / "workflow.json").read_text()) == TINY_WORKFLOW
    assert {p.stem: json.loads(p.read_text()) for p in (out / "steps").iterdir()} == TINY_OBJECTS
    lines = done.stdout.splitlines()
    assert lines[0] == "[export] reading tiny.json"
    assert "[export] 8 steps: 4 fault(s), each an inject held until its heal" in lines
    assert "[export] f1 at 20.5 s held 12.25 s: network_latency on router-replica-1 -> " \
           "NetworkChaos delay on router-replica-1" in lines
    assert "[export] f2 at 40 s held 10 s: process_pause on one -> not exported" in lines
    assert f"[export] wrote {Path('out/workflow.json')} (Workflow ordeal-tiny, Serial)" in lines
    assert "3 of 4 fault(s) exported, 1 not" in lines
    assert any(x.startswith("  NOT exported process_pause on one (f2 at 40 s): Chaos Mesh "
                            "cannot pause") for x in lines)
    assert "stop it:  kubectl delete workflow -n llm ordeal-tiny   (its chaos objects go with " \
           "it)" in lines
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("Ordeal Chaos Mesh export of tiny.json") and "NOT exported" in summary

    # Again into the same directory: the earlier export is replaced.
    done = cli("--chaos-mesh", "tiny.json", *NODE_ARGS, "--run-id", "tiny", "--out", "out",
               cwd=tmp_path)
    assert done.returncode == 0 and "[export] replacing the earlier export in out" in done.stdout
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == sorted([
        "workflow.yaml", "summary.txt", *(f"{stem}.yaml" for stem in TINY_OBJECTS)])
    text = (out / "workflow.yaml").read_text()
    assert text.startswith("# Written by `python -m faults export --chaos-mesh` from tiny.json")
    assert "      deadline: \"5500ms\"\n" in text
    yaml = pyyaml()
    assert yaml.safe_load(text) == TINY_WORKFLOW


def test_cli_refuses_a_foreign_directory_and_fails_when_nothing_exports(tmp_path):
    write_schedule(tmp_path / "tiny.json", TINY)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    done = cli("--chaos-mesh", "tiny.json", *NODE_ARGS, "--out", "mine", cwd=tmp_path)
    assert done.returncode == 2 and "not empty and not an earlier export" in done.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    write_schedule(tmp_path / "pause.json", steps((1.0, 5.0, "process_pause", "one", {})))
    done = cli("--chaos-mesh", "pause.json", cwd=tmp_path)
    assert done.returncode == 1 and "no fault of pause.json could be exported" in done.stderr
    [out] = tmp_path.glob("chaos-mesh-pause-*")  # the default --out: the run id
    assert sorted(p.name for p in out.iterdir()) == ["summary.txt"]


def test_cli_help_documents_every_option(tmp_path):
    done = cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    for option in ("--chaos-mesh", "SCHEDULE_FILE", "--namespace", "--selector", "--node",
                   "--replicas", "--client-cidr", "--http-port", "--router-http-port",
                   "--container", "--kill", "--run-id", "--format", "--out", "Exit status"):
        assert option in done.stdout, option


# ------------------------------------------- docs/examples/kubernetes/

K8S = REPO / "docs/examples/kubernetes"
#: The target file's keys (issue 24's format; README "Test a running deployment").
TARGET_KEYS = {"name", "engine", "model", "entrypoint", "api_key_env", "headers",
               "fault_proxy", "tls", "replica", "hook"}


def test_the_kubernetes_target_file_follows_the_target_format():
    data = tomllib.loads((K8S / "target.toml").read_text())
    assert set(data) <= TARGET_KEYS and {"engine", "model", "entrypoint"} <= set(data)
    assert [r["name"] for r in data["replica"]] == ["replica-0", "replica-1"]
    assert [(h["kind"], h["node"]) for h in data["hook"]] == [
        ("process_kill", "*"), ("process_pause", "*"), ("network_partition", "*")]
    for h in data["hook"]:
        assert set(h) <= {"kind", "node", "inject", "heal", "timeout_s"}
    import ordeal.target as target  # the reader (issue 24 part 1)
    spec = target.read_target_file(K8S / "target.toml")
    assert spec.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert spec.hook("process_pause", "replica-1").node == "*"


def run_hook(command: str, node: str, tmp_path: Path) -> list[list[str]]:
    """Run a hook as Ordeal does (bash -c, ORDEAL_NODE, {node} replaced)
    against a stub kubectl that prints its arguments; each call's argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "kubectl"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\necho ---\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "ORDEAL_NODE": node, "ORDEAL_KIND": "x", "ORDEAL_RUN_ID": "r"}
    done = subprocess.run(["bash", "-c", command.replace("{node}", node)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    calls = done.stdout.split("---\n")
    return [c.splitlines() for c in calls if c]


def test_the_kubernetes_hooks_expand_to_the_kubectl_calls_meant(tmp_path):
    hooks = {h["kind"]: h for h in tomllib.loads((K8S / "target.toml").read_text())["hook"]}
    deploy = "deploy/vllm-llama-1-deployment-vllm"
    expected = {
        ("process_kill", "inject"): [["-n", "llm", "delete", "pod", "-l", "model=llama-1",
                                      "--grace-period=0", "--force", "--wait=false"]],
        ("process_kill", "heal"): [["-n", "llm", "rollout", "status", deploy,
                                    "--timeout=600s"]],
        ("process_pause", "inject"): [["-n", "llm", "exec", deploy, "-c", "vllm", "--", "bash",
                                       "-c", "kill -STOP -1"]],
        ("process_pause", "heal"): [["-n", "llm", "exec", deploy, "-c", "vllm", "--", "bash",
                                     "-c", "kill -CONT -1"]],
        ("network_partition", "inject"): [
            ["-n", "llm", "apply", "-f", "docs/examples/kubernetes/partition-networkpolicy.yaml"],
            ["-n", "llm", "label", "pods", "-l", "model=llama-1", "ordeal/partitioned=true",
             "--overwrite"]],
        ("network_partition", "heal"): [["-n", "llm", "label", "pods", "-l", "model=llama-1",
                                         "ordeal/partitioned=false", "--overwrite"]],
    }
    for (kind, which), calls in expected.items():
        assert run_hook(hooks[kind][which], "replica-1", tmp_path) == calls, (kind, which)
    assert (REPO / "docs/examples/kubernetes/partition-networkpolicy.yaml").is_file()


def test_the_partition_policy_selects_the_label_the_hook_sets():
    yaml = pyyaml()
    policy = yaml.safe_load((K8S / "partition-networkpolicy.yaml").read_text())
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    # No ingress or egress rule under both policy types: nothing in, nothing out.
    assert policy["spec"] == {"podSelector": {"matchLabels": {"ordeal/partitioned": "true"}},
                              "policyTypes": ["Ingress", "Egress"]}


def test_the_example_schedule_replays_and_exports_as_its_readme_shows():
    path = K8S / "example-schedule.json"
    assert load_schedule(path).steps == read_schedule_file(path)  # a replayable schedule file
    run_id = default_run_id(path, path.read_bytes())
    readme = (K8S / "README.md").read_text()
    assert f"Workflow ordeal-{run_id}, Serial" in readme  # the README's output is current
    opts = Options(namespace="llm",
                   selector={"app.kubernetes.io/component": "serving-engine",
                             "app.kubernetes.io/instance": "vllm"},
                   nodes={"replica-0": {"model": "llama-0"}, "replica-1": {"model": "llama-1"},
                          "router": {"app.kubernetes.io/component": "router",
                                     "app.kubernetes.io/instance": "vllm"}},
                   container="vllm", run_id=run_id, source=path.name, defaults=DEFAULTS)
    x = export(read_schedule_file(path), opts)
    assert [(e.held.label, e.chaos[0].crd) for e in x.exported] == [
        ("f0", "NetworkChaos"), ("f1", "PodChaos"), ("f3", "NetworkChaos"), ("f4", "HTTPChaos"),
        ("f5", "TimeChaos")]
    assert [(x.held.label, x.held.kind) for x in x.left_out] == [("f2", "process_pause")]
    start = to_yaml(x.workflow).split("        - f1-process-kill\n")[0]
    assert start in readme
