"""Measure a loader: the DataLoader settings to use (``autotune``) and where a training
loop's time goes (``profile``).

Both run the same timed loop (waiting for data versus the step) and return a result;
neither changes global state.
"""

from fastdata.tune._measure import LoaderConfig, Measurement
from fastdata.tune.autotuner import autotune
from fastdata.tune.profiler import ProfileReport, profile
from fastdata.tune.result import TuneResult

__all__ = ["LoaderConfig", "Measurement", "ProfileReport", "TuneResult", "autotune", "profile"]
