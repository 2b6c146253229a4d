"""Which of the long tests (over two minutes each) run in this run of
``tests/`` (issue 46).

A long test is marked ``@pytest.mark.long(slot=K, covered_by="...")`` with
K in 0..SLOTS-1. In a plain ``pytest tests/`` (CI) it runs when the
commit's rotation slot is K; otherwise it is deselected, and the lines at
the start of the run name it and what covers its ground meanwhile (a
shorter test of the same code). The slot comes from the commit hash (``git
rev-parse HEAD``), so a failure replays with the same choice on the same
commit; each long test runs on about one commit in three. ``pytest tests/
-m long`` runs every long test, and so does ``ORDEAL_LONG=full``;
``ORDEAL_LONG=reduced`` runs none; ``ORDEAL_LONG=<slot>`` picks a slot.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SLOTS = 3
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Rotation:
    slot: int | None  # None: every long test runs; -1: none
    why: str

    def full(self, test_slot: int) -> bool:
        return self.slot is None or test_slot == self.slot


def head_commit(repo: Path = REPO) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) >= 8 else None


def choose(markexpr: str, env: str | None, commit: str | None) -> Rotation:
    """The rotation of this run (pure: the caller reads the mark
    expression, ``ORDEAL_LONG`` and the commit)."""
    if "long" in (markexpr or "").replace("not long", ""):
        return Rotation(None, "-m long: every long test")
    if env:
        if env == "full":
            return Rotation(None, "ORDEAL_LONG=full: every long test")
        if env == "reduced":
            return Rotation(-1, "ORDEAL_LONG=reduced: none")
        if env.isdigit() and int(env) < SLOTS:
            return Rotation(int(env), f"ORDEAL_LONG={env}")
        raise ValueError(f"ORDEAL_LONG={env!r}: use full, reduced or a slot 0-{SLOTS - 1}")
    if commit is None:
        return Rotation(None, "no git commit to rotate by: every long test")
    slot = int(commit[:8], 16) % SLOTS
    return Rotation(slot, f"slot {slot} of {SLOTS}, from commit {commit[:10]}")


def rotation_of(markexpr: str) -> Rotation:
    return choose(markexpr, os.environ.get("ORDEAL_LONG"), head_commit())


#: CI's steps over two minutes that rotate like the long tests (``.ci/run``
#: asks ``python tests/long_rotation.py step NAME``): the smoke suite once more
#: on Triton and once in Docker containers. What covers their ground in every
#: CI: tests/test_triton_engine.py and tests/test_triton_user_repo.py (a Triton
#: cluster driven and judged), tests/test_docker_backend.py (a Docker cluster
#: with faults and heals). Each joins the slot with the least time.
STEPS = {"docker-smoke": 0, "triton-smoke": 1}


#: The per-kind fault suites (CI's ``pytest suites/faults -m faults``) rotate
#: the same way in CI: each test below runs in its slot (650 s for all; a
#: slot's share evens out the slots' other long tests, ~650-700 s a slot with
#: them, docs/DEVELOPING.md "CI times"). Every CI still sees each kind's effect and
#: heal on a real vLLM replica in ``pytest tests/``: FAULT_SUITES_COVERED_BY
#: names where. A suite test not listed runs in every slot, so a new one is
#: never left out; users' own ``pytest suites/faults -m faults`` runs them all.
FAULT_SUITES = {
    "suites/faults/test_process_kill.py::test_killed_replica_is_gone_then_restarted_and_serving": 0,
    "suites/faults/test_process_kill.py::test_one_process_killed_alone_takes_its_node_down_and_"
    "leaves_no_orphan": 0,
    "suites/faults/test_network_latency.py": 0,
    "suites/faults/test_network_partition.py": 0,
    "suites/faults/test_packet_loss.py": 0,
    "suites/faults/test_http_fault.py": 1,
    "suites/faults/test_lsn_jump.py": 1,
    "suites/faults/test_connection_reset.py": 1,
    "suites/faults/test_clock_drift.py": 1,
    "suites/faults/test_process_pause.py": 1,
    "suites/faults/test_process_kill.py::test_long_streams_cut_by_a_kill_end_with_their_cause": 2,
    "suites/faults/test_gpu_memory_pressure.py": 2,
    "suites/faults/test_bandwidth_limit.py": 2,
    "suites/faults/test_gpu_throttle.py": 2,
}

#: Where ``pytest tests/`` observes each rotated kind's effect and heal on a
#: real replica in every CI (``tests/test_long_rotation.py`` checks that each
#: rotated file's kind is here).
FAULT_SUITES_COVERED_BY = {
    "process_kill": "tests/test_real_cluster.py::test_process_kill_is_seen_and_its_heal_is_seen",
    "network_latency": "tests/test_link_faults.py::test_network_latency_is_seen_by_a_probe_and_"
                       "healed",
    "network_partition": "tests/test_kernel_faults.py::test_partition_cuts_a_real_replica_and_the_"
                         "heal_restores_it",
    "packet_loss": "tests/test_kernel_faults.py::test_packet_loss_drops_packets_and_requests_still_"
                   "succeed_slower",
    "http_fault": "tests/test_link_faults.py::test_http_faults_are_classified_and_healed",
    "lsn_jump": "tests/test_link_faults.py::test_lsn_jump_drop_duplicate_reorder_are_caught_and_"
                "healed",
    "connection_reset": "tests/test_link_faults.py::test_connection_reset_is_seen_by_the_client_"
                        "and_healed",
    "gpu_memory_pressure": "tests/test_host_faults.py::test_gpu_memory_pressure_cpu_analog_holds_"
                           "memory_and_heal_releases_it",
    "bandwidth_limit": "tests/test_link_faults.py::test_bandwidth_limit_slows_a_transfer_and_heals",
    "gpu_throttle": "tests/test_host_faults.py::test_gpu_throttle_cpu_quota_drops_throughput_and_"
                    "heal_restores_it",
    "clock_drift": "tests/test_host_faults.py::test_clock_drift_runs_fast_from_the_injection_and_"
                   "heal_stops_it",
    "process_pause": "tests/test_kernel_faults.py::test_process_pause_stops_every_process_and_the_"
                     "heal_resumes_them",
}


def fault_suite_args(rotation: Rotation) -> list[str]:
    """pytest's arguments for CI's fault-suite step: the whole folder, less
    (``--deselect``, a node id prefix) what is not this rotation's."""
    args = ["suites/faults"]
    for nodeid, slot in FAULT_SUITES.items():
        if not rotation.full(slot):
            args += ["--deselect", nodeid]
    return args


def step_runs(name: str, rotation: Rotation) -> bool:
    if name not in STEPS:
        raise ValueError(f"no rotating CI step {name!r}; steps: {sorted(STEPS)}")
    return rotation.full(STEPS[name])


def main(argv: list[str]) -> int:
    """``step NAME``: exit 0 when CI's step NAME runs in this rotation, 1
    when not; one line says which and why (for ``.ci/run``). ``faults``:
    pytest's arguments for the fault-suite step, one per line on stdout,
    and on stderr which run and what covers the others."""
    if argv == ["faults"]:
        try:
            rotation = rotation_of("")
        except ValueError as e:
            print(f"long_rotation: {e}", file=sys.stderr)
            return 2
        args = fault_suite_args(rotation)
        left = [a for a in args[1:] if a != "--deselect"]
        print(f"fault suites ({rotation.why}): {len(FAULT_SUITES) - len(left)} of the "
              f"{len(FAULT_SUITES)} rotated run, and every suite not listed in "
              "tests/long_rotation.py FAULT_SUITES; each kind's effect and heal is seen in "
              "tests/ meanwhile (FAULT_SUITES_COVERED_BY)", file=sys.stderr)
        for nodeid in left:
            print(f"  not this time: {nodeid}", file=sys.stderr)
        print("\n".join(args))
        return 0
    if len(argv) != 2 or argv[0] != "step":
        print(f"usage: python tests/long_rotation.py step {{{','.join(sorted(STEPS))}}}"
              " | faults")
        return 2
    try:
        rotation = rotation_of("")
        runs = step_runs(argv[1], rotation)
    except ValueError as e:
        print(f"long_rotation: {e}")
        return 2
    slot = STEPS[argv[1]]
    print(f"step {argv[1]} (slot {slot}): {'runs' if runs else 'not this time'} "
          f"({rotation.why})")
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
