"""Checkers over a history. Pure: no sockets, no processes, no exceptions out."""

from .base import Checker, Result, RunContext, merge_valid, run_checker
from .determinism import CanaryDeterminism
from .drift import Drift
from .duplicates import NoDuplicateExecution
from .failover import Failover
from .fault_effective import FaultEffective
from .fault_slo import FaultSLO
from .no_orphans import NoOrphans
from .no_silent_loss import NoSilentLoss
from .node_health import CountersMonotonic, HealthTruthful, LeakBound, NodesServeAtEnd
from .planted import PLANTED, ExcludingPlanted, PlantedDetected, with_planted
from .replica_errors import ReplicaErrors
from .settings import CheckerSettings, FaultSLOTargets, SLOTargets
from .slo import (
                    Availability,
                    ErrorRate,
                    Goodput,
                    LatencySLO,
                    Recovery,
                    RestartReadiness,
                    ScheduleLag,
)
from .stream_continuity import StreamContinuity
from .stream_wellformed import StreamWellFormed
from .usage import UsageMatchesTokens

DEFAULT_CHECKERS = (NoSilentLoss, StreamWellFormed, UsageMatchesTokens, NoDuplicateExecution,
                    ReplicaErrors, CanaryDeterminism, StreamContinuity,
                    LatencySLO, Goodput, ErrorRate, Availability, Recovery, RestartReadiness,
                    ScheduleLag, Failover, FaultSLO, FaultEffective, NoOrphans, HealthTruthful,
                    CountersMonotonic, LeakBound, NodesServeAtEnd)

__all__ = ["Checker", "Result", "RunContext", "merge_valid", "run_checker", "CheckerSettings",
           "SLOTargets", "FaultSLOTargets",
           "NoSilentLoss", "StreamWellFormed", "UsageMatchesTokens", "NoDuplicateExecution",
           "ReplicaErrors", "CanaryDeterminism",
           "StreamContinuity",
           "LatencySLO", "Goodput", "ErrorRate", "Availability", "Recovery",
           "RestartReadiness", "ScheduleLag", "Failover", "FaultSLO", "FaultEffective", "NoOrphans",
           "HealthTruthful", "CountersMonotonic", "LeakBound", "NodesServeAtEnd", "Drift",
           "DEFAULT_CHECKERS", "PLANTED", "ExcludingPlanted", "PlantedDetected", "with_planted"]
