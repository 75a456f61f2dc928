"""Localization: name the device (or workload cause) slowing a job from its operator records.

* :mod:`~holmes_ml.localize.types`: :class:`DeviceKind`, :class:`Evidence`, :class:`Candidate`,
  :class:`WorkloadFinding`, :class:`Verdict` (``Verdict.to_dict()`` is the JSON contract).
* :mod:`~holmes_ml.localize.rules`: the graph rules and the cross-iteration ranking.
* :mod:`~holmes_ml.localize.fabric`: the cached :class:`Fabric` (the network devices a
  communicator crosses, over a :class:`~holmes_ml.topology.Topology`).
"""

from holmes_ml.localize.config import LocalizeConfig
from holmes_ml.localize.fabric import Fabric
from holmes_ml.localize.rules import localize_records
from holmes_ml.localize.types import Candidate, DeviceKind, Evidence, Verdict, WorkloadFinding

#: The non-device cause reported in ``Verdict.to_dict()["workload"]``.
WORKLOAD = "workload"

__all__ = [
    "WORKLOAD",
    "Candidate",
    "DeviceKind",
    "Evidence",
    "Fabric",
    "LocalizeConfig",
    "Verdict",
    "WorkloadFinding",
    "localize_records",
]
