"""holmes_ml: find which GPU, NIC, link or host silently slows a distributed training job.

Data flows one way: ``io`` (read/validate into the canonical CommOps table) -> ``features`` ->
``models`` (detect abnormal operators) -> ``localize`` (graph, rules, ranking) -> report.
"""

__version__ = "0.1.0"
