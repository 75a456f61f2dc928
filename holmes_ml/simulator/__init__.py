"""Trace-driven simulator of distributed training jobs with injected faults and op-level labels.

>>> from holmes_ml.simulator import SimConfig, FaultSpec, simulate
>>> res = simulate(SimConfig(gpus=16, model="llama2-7b", iterations=2))
>>> bool(res.ops["abnormal"].any())
False
"""

from holmes_ml.simulator.calibrate import Calibration, fit_calibration, load_calibration
from holmes_ml.simulator.config import FAULT_KINDS, PATTERNS, FaultSpec, Layout, SimConfig
from holmes_ml.simulator.engine import ABNORMAL_ABS_US, ABNORMAL_REL, ABNORMAL_SPREAD, Engine
from holmes_ml.simulator.models import HARDWARE, MODELS, Hardware, ModelSpec
from holmes_ml.simulator.result import SimResult, load_result, simulate, simulate_to

__all__ = [
    "ABNORMAL_ABS_US",
    "ABNORMAL_REL",
    "ABNORMAL_SPREAD",
    "FAULT_KINDS",
    "HARDWARE",
    "MODELS",
    "PATTERNS",
    "Calibration",
    "Engine",
    "FaultSpec",
    "Hardware",
    "Layout",
    "ModelSpec",
    "SimConfig",
    "SimResult",
    "fit_calibration",
    "load_calibration",
    "load_result",
    "simulate",
    "simulate_to",
]
