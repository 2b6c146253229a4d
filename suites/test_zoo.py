"""The failure zoo (issue 40): each shape of faults/zoo/ planted inside the
serving path of the real cluster, a few seconds into a plain load run, and
the default verdict judged. The checkers are not told: no fault window, no
nemesis op. A shape the verdict does not fail, naming one of the invariants
that should see it, is a false pass, and this test fails saying so. The
clean run (no shape) must pass. Each run appends its record (caught, by
which invariant, seconds from the plant to the first counterexample) to
``<runs dir>/zoo-results.jsonl``; ``python -m bench --only zoo`` makes the
table of bench/results/zoo.md from it.

    pytest suites/test_zoo.py -m zoo                 # every shape, ~8 min in all
    pytest suites/test_zoo.py -m zoo -k usage        # one
"""

from __future__ import annotations

import pytest

from faults.zoo import SHAPES
from load.spec import WorkloadSpec
from runs.run import assert_verdict
from runs.zoo import LOAD_S, append_record, run_shape, shape_problems

pytestmark = [pytest.mark.zoo, pytest.mark.cluster]


@pytest.mark.parametrize("name", ["clean", *SHAPES])
def test_the_default_verdict_catches_each_shape(name, ordeal_run, ordeal_config,
                                                ordeal_cluster, ordeal_say):
    shape = SHAPES.get(name)
    spec = WorkloadSpec(duration_s=LOAD_S, rate=ordeal_config.load_rate, seed=ordeal_config.seed)
    record, summary = run_shape(ordeal_run, ordeal_cluster, shape, spec, ordeal_say)
    append_record(ordeal_config.runs_dir, record)
    if shape is None:
        assert_verdict(summary)  # the clean stack passes: no false positive
        return
    problems = shape_problems(shape, record)
    assert not problems, problems[0]
