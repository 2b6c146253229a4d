"""Target selection, schedules and the schedule executor: pure planning is
tested exactly; the executor runs a real (file-flipping) fault."""

import asyncio
import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.base import Fault, FaultError
from faults.factory import build_faults, fault_class
from faults.ledger import Ledger
from faults.nemesis import run_schedule
from faults.schedule import FaultChoice, Step, is_healed_at_end, plan_schedule
from faults.targets import select
from ordeal.config import ConfigError
from ordeal.history.reader import read_history
from ordeal.history.writer import History

# -- targets ----------------------------------------------------------------

@pytest.mark.parametrize("n,mode,size", [(1, "one", 1), (5, "one", 1), (5, "minority", 2),
                                         (5, "majority", 3), (4, "minority", 1),
                                         (4, "majority", 3), (3, "all", 3), (1, "minority", 1)])
def test_mode_sizes(n, mode, size):
    names = [f"n{i}" for i in range(n)]
    got = select(mode, names, random.Random(1))
    assert len(got) == size and set(got) <= set(names) and len(set(got)) == size


def test_selection_is_seeded_and_names_are_exact():
    names = [f"n{i}" for i in range(9)]
    assert select("majority", names, random.Random(7)) == select("majority", names,
                                                                 random.Random(7))
    assert select("n3, n1", names, random.Random(0)) == ["n3", "n1"]


@pytest.mark.parametrize("spec", ["n9", "", "one,two"])
def test_unknown_targets_are_refused_with_the_choices(spec):
    with pytest.raises(FaultError, match="unknown name"):
        select(spec, ["n0", "n1"], random.Random(0))


# -- schedules --------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.floats(20, 3600), st.floats(0.2, 30), st.floats(0.2, 30))
def test_every_schedule_ends_healed_inside_its_duration(seed, duration, q, h):
    steps = plan_schedule([FaultChoice("process_kill"), FaultChoice("process_pause")],
                          duration, seed, quiet_s=(q / 2, q), hold_s=(h / 2, h))
    assert is_healed_at_end(steps)
    assert all(0 <= s.at_s <= duration - 10 + 1e-6 for s in steps)
    assert steps == plan_schedule([FaultChoice("process_kill"), FaultChoice("process_pause")],
                                  duration, seed, quiet_s=(q / 2, q), hold_s=(h / 2, h))


def test_the_last_heal_stays_inside_the_bound_after_rounding():
    """A counterexample Hypothesis found (seed 2541): the last heal, rounded
    to the millisecond, must not land past duration - tail."""
    duration = 1611.096736288859
    steps = plan_schedule([FaultChoice("process_kill"), FaultChoice("process_pause")],
                          duration, 2541, quiet_s=(0.1, 0.2),
                          hold_s=(0.6687263362336527 / 2, 0.6687263362336527))
    assert steps and max(s.at_s for s in steps) <= duration - 10


def test_cycle_takes_each_choice_in_turn():
    kinds = ["a", "b", "c"]
    steps = plan_schedule([FaultChoice(k) for k in kinds], 600, 5, cycle=True)
    injected = [s.kind for s in steps if s.action == "inject"]
    assert len(injected) >= 6 and injected == [kinds[i % 3] for i in range(len(injected))]


def test_is_healed_at_end_catches_a_missing_heal():
    steps = plan_schedule([FaultChoice("process_kill")], 300, 3)
    assert steps and is_healed_at_end(steps)
    assert not is_healed_at_end(steps[:-1])


def test_bad_schedule_settings_are_clear():
    with pytest.raises(ConfigError, match="no fault"):
        plan_schedule([], 100, 0)
    with pytest.raises(ConfigError, match="hold_s"):
        plan_schedule([FaultChoice("process_kill")], 100, 0, hold_s=(5, 1))
    with pytest.raises(ConfigError, match="no time"):
        plan_schedule([FaultChoice("process_kill")], 100, 0, quiet_s=(0, 0), hold_s=(0, 1))


# -- factory ----------------------------------------------------------------

class _Node:
    def __init__(self, name, role="replica"):
        self.name, self.role = name, role

    def is_running(self):
        return True


class _Cluster:
    links = ()

    def __init__(self):
        self.nodes = [_Node("replica-0"), _Node("replica-1"), _Node("router", "router")]

    def replicas(self):
        return self.nodes[:2]

    def node(self, name):
        return next(n for n in self.nodes if n.name == name)


def test_factory_refuses_unknown_kinds_bad_params_and_missing_links(tmp_path):
    c, ledger, rng = _Cluster(), Ledger(tmp_path), random.Random(0)
    with pytest.raises(FaultError, match="unknown fault kind 'nope'; known kinds: .*process_kill"):
        build_faults("nope", "one", c, "r", ledger, rng)
    with pytest.raises(FaultError, match="bad parameters"):
        build_faults("process_kill", "one", c, "r", ledger, rng, {"bogus": 1})
    with pytest.raises(FaultError, match="unknown name"):
        build_faults("process_kill", "replica-7", c, "r", ledger, rng)
    [f] = build_faults("process_kill", "router", c, "r", ledger, rng)
    assert f.target == "router" and fault_class("process_kill") is type(f)
    assert ledger.pending() == []  # building changes nothing


# -- the executor -----------------------------------------------------------

class FlagFault(Fault):
    """A real, observable fault on a file: present = injected."""
    kind = "test_flag"

    def __init__(self, path: Path, run_id: str, ledger: Ledger, fail: bool = False):
        super().__init__(path.name, run_id, ledger)
        self.path, self.fail = path, fail

    def _inverse(self):
        return {"path": str(self.path)}

    def _act(self):
        if self.fail:
            raise OSError("cannot inject")
        self.path.write_text("on")
        return {}

    @classmethod
    def undo(cls, entry):
        Path(entry.inverse["path"]).unlink(missing_ok=True)
        return {}


def test_executor_injects_and_heals_in_order_and_ends_healed(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    h = History(tmp_path / "h.jsonl")
    seen = []
    steps = [Step(0.0, "inject", "test_flag", "a", 0), Step(0.2, "heal", "test_flag", "a", 0),
             Step(0.3, "inject", "test_flag", "b", 1)]  # never healed by the plan

    def make(step):
        f = FlagFault(tmp_path / step.target, "r", ledger, fail=step.target == "b")
        seen.append(f)
        return [f]

    windows = asyncio.run(run_schedule(steps, make, h))
    h.close()
    assert [w.target for w in windows] == ["a", "b"]
    assert windows[0].injected and windows[0].healed and not windows[0].error
    assert "inject failed" in windows[1].error
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert ledger.pending() == []
    ops = [(o.f, o.value.get("phase")) for o in read_history(tmp_path / "h.jsonl")]
    assert ops[:4] == [("inject", "begin"), ("inject", "end"), ("heal", "begin"), ("heal", "end")]


def test_executor_heals_what_is_active_when_cancelled(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    h = History(tmp_path / "h.jsonl")
    steps = [Step(0.0, "inject", "test_flag", "a", 0), Step(60, "heal", "test_flag", "a", 0)]

    async def go():
        task = asyncio.create_task(run_schedule(
            steps, lambda s: [FlagFault(tmp_path / "a", "r", ledger)], h))
        # Cancelled once the inject is seen (the step at 0 s), however slow
        # the loop is today; the heal at 60 s is far off either way.
        loop, t0 = asyncio.get_running_loop(), asyncio.get_running_loop().time()
        while not (tmp_path / "a").exists() and loop.time() - t0 < 30:
            await asyncio.sleep(0.01)
        assert (tmp_path / "a").exists() and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert not (tmp_path / "a").exists() and ledger.pending() == []


class SlowHealFault(FlagFault):
    """Its heal takes 1.5 s, as a restart that waits for readiness does."""

    @classmethod
    def undo(cls, entry):
        time.sleep(1.5)
        return super().undo(entry)


def test_a_slow_action_pushes_the_rest_of_the_schedule_back(tmp_path):
    """The quiet period after a slow heal keeps its planned length, so the
    next fault does not land on the heal's after-heal window."""
    ledger = Ledger(tmp_path / "ledger")
    h = History(tmp_path / "h.jsonl")
    steps = [Step(0.0, "inject", "test_flag", "a", 0), Step(0.2, "heal", "test_flag", "a", 0),
             Step(1.0, "inject", "test_flag", "b", 1), Step(1.1, "heal", "test_flag", "b", 1)]
    asyncio.run(run_schedule(steps, lambda s: [SlowHealFault(tmp_path / s.target, "r", ledger)
                                               if s.target == "a" else
                                               FlagFault(tmp_path / s.target, "r", ledger)], h))
    h.close()
    ops = list(read_history(tmp_path / "h.jsonl"))
    heal_a_end = next(o for o in ops if o.f == "heal" and o.value.get("phase") == "end")
    inject_b = next(o for o in ops if o.f == "inject" and o.value.get("target") == "b")
    gap_s = (inject_b.time_ns - heal_a_end.time_ns) / 1e9
    assert gap_s >= 0.75, f"the 0.8 s quiet after the slow heal shrank to {gap_s:.2f} s"


def test_time_the_plan_left_for_a_slow_action_is_not_paid_twice(tmp_path):
    """A compressed plan leaves a restart its time after the heal
    (Step.allow_s): the next fault then comes at its planned time, not a
    whole heal later. Measured against the same schedule without the
    allowance, run here just before."""
    def inject_b_after_s(allow_s: float, name: str) -> float:
        ledger = Ledger(tmp_path / name / "ledger")
        (tmp_path / name).mkdir(exist_ok=True)
        h = History(tmp_path / name / "h.jsonl")
        steps = [Step(0.0, "inject", "test_flag", "a", 0),
                 Step(0.2, "heal", "test_flag", "a", 0, allow_s=allow_s),
                 Step(2.5, "inject", "test_flag", "b", 1), Step(2.6, "heal", "test_flag", "b", 1)]
        asyncio.run(run_schedule(steps, lambda s: [
            SlowHealFault(tmp_path / name / s.target, "r", ledger) if s.target == "a" else
            FlagFault(tmp_path / name / s.target, "r", ledger)], h))
        h.close()
        ops = list(read_history(tmp_path / name / "h.jsonl"))
        inject_a = next(o for o in ops if o.f == "inject" and o.value.get("target") == "a")
        inject_b = next(o for o in ops if o.f == "inject" and o.value.get("target") == "b")
        return (inject_b.time_ns - inject_a.time_ns) / 1e9

    pushed = inject_b_after_s(0.0, "pushed")  # 2.5 s planned + the 1.5 s heal
    allowed = inject_b_after_s(2.0, "allowed")  # the 1.5 s heal fits the 2.0 s allowed
    assert allowed < pushed - 1.0, (allowed, pushed)


class _RayNodeStandIn:
    """What the factory reads of a simulated Ray node: its name. The fault
    itself acts on the real one in tests/test_ray_backend.py and
    suites/faults/test_ray_node_*.py."""

    def __init__(self, name: str):
        self.name = name


class _Clusterish:
    def __init__(self, backend: str, ray_nodes: list):
        self.backend, self.ray_nodes, self.links, self.nodes = backend, ray_nodes, [], []


def test_ray_node_kinds_target_the_ray_nodes_by_word_or_name():
    nodes = [_RayNodeStandIn(f"ray-node-{i}") for i in range(3)]
    cluster = _Clusterish("ray", nodes)
    for kind in ("ray_node_loss", "ray_node_pause", "ray_node_partition"):
        named = build_faults(kind, "ray-node-2", cluster, "r", Ledger(), random.Random(0))
        assert [f.node for f in named] == [nodes[2]] and named[0].kind == kind
    every = build_faults("ray_node_loss", "all", cluster, "r", Ledger(), random.Random(0))
    assert [f.node for f in every] == nodes
    with pytest.raises(FaultError, match="unknown name"):
        build_faults("ray_node_loss", "replica-0", cluster, "r", Ledger(), random.Random(0))


def test_ray_node_kinds_on_another_backend_say_what_to_run():
    with pytest.raises(FaultError, match="run with --cluster ray .*'local'"):
        build_faults("ray_node_pause", "one", _Clusterish("local", []), "r", Ledger(),
                     random.Random(0))
