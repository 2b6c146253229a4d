"""A fault kind is one module (issue 41): everything Ordeal knows of a kind
is declared on its class (``traits``, ordeal.kinds), and the catalogue, the
endurance plan, the Chaos Mesh export, the target file, the fault factory
and the failover checkers read it from there. A throwaway kind declared in
this one file must show up in each of them, and be gone again after."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from faults import catalogue, chaos_mesh
from faults.__main__ import catalogue_lines
from faults.base import Fault
from faults.factory import fault_class
from faults.ledger import LedgerEntry
from faults.schedule import Step
from ordeal import kinds as kind_traits
from ordeal.config import ConfigError
from ordeal.kinds import EnduranceChoice, KindTraits
from ordeal.target import read_target_file, trustable_kinds
from runs.endurance_plan import EndurancePlan, all_choices, kinds_option

REPO = Path(__file__).resolve().parent.parent
NAME = "throwaway_stall"
TARGET = ('entrypoint = "http://127.0.0.1:8000"\nmodel = "m"\nfault_proxy = false\n'
          '[[replica]]\nname = "pod-a"\nurl = "http://127.0.0.1:8001"\n'
          f'[[hook]]\nkind = "{NAME}"\nnode = "*"\ninject = "true"\nheal = "true"\n')


def declare_throwaway() -> type[Fault]:
    """A 13th kind, declared the way a kind's module declares it."""

    class ThrowawayStall(Fault):
        kind = NAME
        traits = KindTraits(kind, stops_target=True, hookable=True,
                            endurance=EnduranceChoice("one", {"depth": 3}, position=50),
                            chaos_mesh_none="a throwaway kind of a test: nothing to map")
        privilege = "acts on nothing: a kind declared by a test to prove the registry"

        def _inverse(self) -> dict[str, Any]:
            return {}

        def _act(self) -> dict[str, Any]:
            return {}

        @classmethod
        def undo(cls, entry: LedgerEntry) -> dict[str, Any]:
            return {}

    return ThrowawayStall


@pytest.fixture
def throwaway():
    cls = declare_throwaway()
    try:
        yield cls
    finally:
        catalogue.unregister(NAME)


def test_a_kind_declared_in_one_file_is_in_every_list_that_reads_kinds(throwaway, tmp_path):
    # The catalogue and its listing, the factory.
    assert NAME in catalogue.common_kinds() and catalogue.REGISTRY[NAME] is throwaway
    assert fault_class(NAME) is throwaway
    assert any(line.startswith(NAME + " ") for line in catalogue_lines())
    # The Chaos Mesh export leaves it out, with the reason it declares.
    steps = [Step(1.0, "inject", NAME, "one", 0), Step(5.0, "heal", NAME, "one", 0)]
    out = chaos_mesh.export(steps, chaos_mesh.Options())
    assert [x.reason for x in out.left_out] == ["a throwaway kind of a test: nothing to map"]
    # The endurance cycle takes it, with its parameters, and --faults knows it.
    assert (NAME, "one", {"depth": 3}) in [(c.kind, c.target, c.params) for c in all_choices()]
    plan = EndurancePlan(duration_s=3 * 3600, seed=1)
    assert NAME in plan.kinds and NAME in {s.kind for s in plan.schedule()}
    assert kinds_option(NAME) == (NAME,)
    # A target file's hook may act for it, and it may be trusted.
    path = tmp_path / "target.toml"
    path.write_text(TARGET)
    target = read_target_file(path)
    assert target.unsupported(NAME) is None and NAME in trustable_kinds()
    # The failover checkers judge its windows (it stops its target).
    assert NAME in kind_traits.stopping_kinds()


def test_a_kind_taken_out_is_gone_from_every_list(tmp_path):
    catalogue.unregister(NAME)
    declare_throwaway()
    catalogue.unregister(NAME)
    assert NAME not in catalogue.REGISTRY and kind_traits.of(NAME) is None
    assert NAME not in EndurancePlan(duration_s=3600).kinds
    assert NAME not in kind_traits.stopping_kinds()
    path = tmp_path / "target.toml"
    path.write_text(TARGET)
    with pytest.raises(ConfigError, match=f"'{NAME}': hooks act for"):
        read_target_file(path)
    with pytest.raises(ConfigError, match="unknown kind"):
        kinds_option(NAME)


def test_a_second_class_for_a_kind_and_traits_of_another_name_are_refused(throwaway):
    with pytest.raises(TypeError, match="both declare it"):
        class Again(throwaway):  # noqa: F841 - refused as it is defined
            traits = throwaway.traits
    with pytest.raises(TypeError, match="traits name"):
        class Misnamed(Fault):  # noqa: F841
            kind = "throwaway_misnamed"
            traits = KindTraits("throwaway_other")
    assert kind_traits.of("throwaway_other") is None


def test_every_registered_kind_declares_its_own_traits():
    assert len(catalogue.common_kinds()) == 12 and len(catalogue.backend_kinds()) == 3
    for kind, cls in catalogue.REGISTRY.items():
        assert "traits" in vars(cls) and cls.traits.kind == kind, kind
        assert cls.traits is kind_traits.of(kind)
        # A kind with no mapping says why, a mapped kind says what it changes.
        assert bool(cls.traits.chaos_mesh_none) != (kind in chaos_mesh.MAPPERS), kind
        assert (kind in chaos_mesh.NOTES) == (kind in chaos_mesh.MAPPERS), kind
    # What the old lists held, now from the declarations.
    assert kind_traits.stopping_kinds() == {
        "process_kill", "process_pause", "network_partition",
        "ray_node_loss", "ray_node_pause", "ray_node_partition"}
    assert kind_traits.l4_link_kinds() == ("bandwidth_limit", "connection_reset",
                                           "network_latency")
    assert kind_traits.l7_link_kinds() == ("http_fault", "lsn_jump")
    assert kind_traits.restarting_kinds() == {"process_kill", "ray_node_loss"}
    # The cycle keeps the order it always had: a seed gives the plan it gave.
    assert [c.kind for c in all_choices()][:12] == [
        "process_pause", "network_latency", "network_partition", "packet_loss",
        "bandwidth_limit", "clock_drift", "connection_reset", "gpu_throttle", "lsn_jump",
        "gpu_memory_pressure", "http_fault", "process_kill"]


def test_only_the_consumers_import_the_catalogue():
    """The catalogue imports every other module of faults/ to find the
    kinds; a module that imported it back would be a cycle."""
    for path in sorted((REPO / "faults").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if "catalogue" in imported or "faults.catalogue" in imported:
            assert path.stem in catalogue.CONSUMERS, path.name


def test_asking_what_a_kind_does_before_the_catalogue_is_loaded_raises():
    """A checker that knew no kind would judge no window and pass: the
    failover checker, made without the catalogue, refuses to start."""
    code = ("from invariants.failover import Failover\n"
            "from invariants.base import RunContext\n"
            "from ordeal.kinds import KindsNotLoaded\n"
            "try:\n"
            "    Failover().start(RunContext())\n"
            "except KindsNotLoaded as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "refused: the fault kinds are not loaded" in out.stdout, (
        out.stdout, out.stderr)
