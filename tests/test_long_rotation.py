"""The rotation of the long tests (tests/long_rotation.py, issue 46): the
slot follows the commit, ``-m long`` and ``ORDEAL_LONG`` override it, and
a bad ``ORDEAL_LONG`` is an error that says what to write."""

import pytest
from long_rotation import SLOTS, choose


def test_the_slot_follows_the_commit_and_every_slot_comes_up():
    seen = {choose("", None, f"{n:08x}" + "0" * 32).slot for n in range(12)}
    assert seen == set(range(SLOTS))
    one = choose("", None, "deadbeef" + "0" * 32)
    assert one.slot == int("deadbeef", 16) % SLOTS and "deadbeef" in one.why
    assert one.full(one.slot) and not one.full((one.slot + 1) % SLOTS)


def test_minus_m_long_and_the_variable_override_the_commit():
    sha = "deadbeef" + "0" * 32
    assert choose("long", None, sha).slot is None  # all in full
    assert choose("cluster and long", None, sha).full(0)
    assert choose("not long", None, sha).slot == int("deadbeef", 16) % SLOTS
    assert choose("", "full", sha).slot is None
    reduced = choose("", "reduced", sha)
    assert not any(reduced.full(k) for k in range(SLOTS))
    assert choose("", "2", sha).slot == 2
    assert choose("", None, None).slot is None  # no git: every long test runs
    with pytest.raises(ValueError, match="use full, reduced or a slot"):
        choose("", "sometimes", sha)


def test_ci_s_rotating_steps_follow_the_same_slot_and_say_so(tmp_path):
    """``.ci/run`` asks ``python tests/long_rotation.py step NAME``: exit 0
    runs the step, 1 skips it with a line that says why, 2 is a usage error
    (never a silent skip); every slot runs or skips each step as its slot
    says, and every step comes up in some slot."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from long_rotation import STEPS, Rotation, step_runs

    for name, slot in STEPS.items():
        assert step_runs(name, Rotation(slot, "x"))
        assert not step_runs(name, Rotation((slot + 1) % SLOTS, "x"))
        assert step_runs(name, Rotation(None, "full")) and not step_runs(name, Rotation(-1, "r"))
    assert {slot for slot in STEPS.values()} <= set(range(SLOTS))
    with pytest.raises(ValueError, match="no rotating CI step 'nope'"):
        step_runs("nope", Rotation(0, "x"))
    script = Path(__file__).resolve().parent / "long_rotation.py"
    name, slot = next(iter(STEPS.items()))
    for env, rc in ((str(slot), 0), (str((slot + 1) % SLOTS), 1), ("full", 0), ("reduced", 1)):
        out = subprocess.run([sys.executable, str(script), "step", name], capture_output=True,
                             text=True, env={**os.environ, "ORDEAL_LONG": env}, cwd=tmp_path)
        assert out.returncode == rc, (env, out.stdout, out.stderr)
        assert f"step {name} (slot {slot})" in out.stdout and "ORDEAL_LONG" in out.stdout
    bad = subprocess.run([sys.executable, str(script), "step", "nope"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "no rotating CI step" in bad.stdout


def test_ci_s_fault_suites_rotate_and_each_rotated_kind_is_seen_in_tests_meanwhile(tmp_path):
    """``python tests/long_rotation.py faults`` prints the fault-suite
    step's arguments: every slot deselects exactly the others' tests, every
    listed test exists (a renamed one would run in every slot unnoticed), and
    each rotated kind names a test in tests/ that exists, so the kind's
    effect and heal are still seen in every CI."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from long_rotation import (
        FAULT_SUITES,
        FAULT_SUITES_COVERED_BY,
        REPO,
        Rotation,
        fault_suite_args,
    )

    def defined(nodeid: str) -> bool:
        path, _, name = nodeid.partition("::")
        text = (REPO / path).read_text() if (REPO / path).is_file() else None
        return text is not None and (not name or re.search(
            rf"^def {re.escape(name.split('[')[0])}\(", text, re.M) is not None)

    for nodeid in FAULT_SUITES:
        assert defined(nodeid), f"FAULT_SUITES names {nodeid}, which does not exist"
        kind = Path(nodeid.split("::")[0]).stem.removeprefix("test_")
        assert defined(FAULT_SUITES_COVERED_BY[kind]), FAULT_SUITES_COVERED_BY[kind]
    for slot in range(SLOTS):
        args = fault_suite_args(Rotation(slot, "x"))
        assert args[0] == "suites/faults"
        gone = set(args[2::2])
        assert set(args[1::2]) == {"--deselect"}
        assert gone == {n for n, s in FAULT_SUITES.items() if s != slot}
    assert fault_suite_args(Rotation(None, "full")) == ["suites/faults"]
    assert {slot for slot in FAULT_SUITES.values()} == set(range(SLOTS))
    script = REPO / "tests" / "long_rotation.py"
    out = subprocess.run([sys.executable, str(script), "faults"], capture_output=True, text=True,
                         env={**os.environ, "ORDEAL_LONG": "1"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == fault_suite_args(Rotation(1, "x"))
    assert "ORDEAL_LONG=1" in out.stderr and "not this time" in out.stderr
    bad = subprocess.run([sys.executable, str(script), "faults"], capture_output=True, text=True,
                         env={**os.environ, "ORDEAL_LONG": "often"}, cwd=tmp_path)
    assert bad.returncode == 2 and "use full, reduced or a slot" in bad.stderr and not bad.stdout
