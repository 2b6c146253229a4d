"""The cores each vLLM replica gets (engines/vllm/cpus.py): pure planning.
That the running replicas really are confined is checked on real clusters
(tests/test_real_cluster.py, tests/test_docker_backend.py)."""

import pytest

from engines.vllm.cpus import ReplicaCpus, replica_cpus
from ordeal.config import ClusterSpec, ConfigError


def test_each_replica_gets_its_own_slice_of_the_cores():
    assert [replica_cpus([0, 1], 2, i) for i in range(2)] == [
        ReplicaCpus(0, (0,)), ReplicaCpus(1, (1,))]
    # 16 cores, 3 replicas: five each, the 16th to no replica (harness, router)
    got = [replica_cpus(range(16), 3, i).allowed for i in range(3)]
    assert got == [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11, 12, 13, 14)]
    assert not set(got[0]) & set(got[1]) and 15 not in sum(got, ())
    # Only the harness's cores count, in order, whatever their numbers.
    assert replica_cpus([7, 3], 2, 0) == ReplicaCpus(3, (3,))


def test_more_replicas_than_cores_share_round_robin():
    assert [replica_cpus([0, 1], 3, i).allowed for i in range(3)] == [(0,), (1,), (0,)]


def test_shared_binds_only_the_compute_threads():
    r = replica_cpus([0, 1, 2, 3], 2, 1, mode="shared")
    assert r == ReplicaCpus(compute=2, allowed=None)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no cores"):
        replica_cpus([], 2, 0)
    with pytest.raises(ConfigError, match="--replica-cpus 'mine'.*own, shared"):
        ClusterSpec(replica_cpus="mine")
