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
