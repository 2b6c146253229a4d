"""A replica answers HTML 5xx pages, and the router's retries hide them: the
router sends each failed request again, to a replica that serves it, so the
clients see successes (a little slower) while one replica fails every
request it is given and the cluster runs on half its capacity. Users saw a
gateway whose deployment answered 80% 5xx keep its clients' failure rate at
0% while p95 latency grew tenfold (RosieOh/RoundHouse#14); an nginx that
retries 5xx on the next upstream answers its own HTML error page for the
requests it may not retry (openresty/openresty#351); and an Envoy gateway
whose only trace of failing backends was its own ``upstream_rq_xx{class=5}``
counter (dsx-ai-factory/nv-config-manager#250).

Planted inside the last replica's API server through Ordeal's own
middleware (ordeal/planted.py): while the plant holds, every POST to
``/v1/`` is answered 503 with an HTML page, without running it; /health
and /metrics answer as before. Nothing is announced: ``replica_errors``
must see it from the replicas' served journals. Measured with vllm-router
0.1.17: each 503 was retried on the other replica, and the router's circuit
breaker opened for the failing one after about 13 answers (then a probe
every 5 s): the clients saw no error at all, and no other invariant failed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ordeal.journal import JournalTail, journal_path
from ordeal.planted import error_path

from .base import Shape, ZooCluster, local_log_dir

SOURCES = ("RosieOh/RoundHouse#14", "openresty/openresty#351",
           "dsx-ai-factory/nv-config-manager#250")
STATUS = 503


@contextlib.contextmanager
def plant(cluster: ZooCluster) -> Iterator[dict[str, Any]]:
    node = cluster.replicas()[-1]
    log_dir = local_log_dir(node, "html_5xx_hidden_by_retries")
    journal = JournalTail(journal_path(log_dir, node.name))  # from here on
    path = error_path(log_dir, node.name)
    evidence: dict[str, Any] = {"node": node.name, "status": STATUS, "hits": 0}
    path.write_text(str(STATUS))
    try:
        yield evidence
    finally:
        path.unlink(missing_ok=True)
        entries, _, _ = journal.read_new()
        evidence["hits"] = sum(1 for _, status, _ in entries if status == STATUS)
        evidence["answered_ok"] = sum(1 for _, status, _ in entries if status == 200)


SHAPE = Shape(
    name="html_5xx_hidden_by_retries",
    title="a replica answers HTML 5xx pages that the router's retries hide from the clients",
    sources=SOURCES,
    caught_by=("replica_errors",),
    how=f"the last replica's API server answers every POST {STATUS} with an HTML page "
        "(Ordeal's middleware, ordeal/planted.py)",
    plant=plant)
