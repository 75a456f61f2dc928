"""Fault drill: a real N-process gloo job with a TP x PP x DP layout, logged by
:class:`holmes_ml.collect.CommOpsLogger`, with a fault injected on one rank, then localized.

Operators run it (``holmes drill``) to check the tool on their own machines: the drill knows
which rank it slowed down and says whether the localizer put that rank on top.
"""

from holmes_ml.drill.runner import FAULTS, DrillConfig, DrillResult, run_drill

__all__ = ["FAULTS", "DrillConfig", "DrillResult", "run_drill"]
