"""Kinds of run: ``run`` (OrdealRun, the order of any run: load, nemesis,
checks, summary), ``single_fault`` (one inject/heal under load, for
suites/faults), ``endurance`` (long schedules, resumable), ``explore`` and
``explore_machine`` (Hypothesis exploration with shrinking),
``gpu_scenario`` (the GPU node's scenario)."""
