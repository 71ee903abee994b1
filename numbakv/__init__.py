"""numbakv: a cell-layout KV cache for numba.cuda, with a NumPy reference.

Importing this package imports no numba: names are resolved on first use, so
`numbakv.reference`, `numbakv.errors`, `numbakv.trace`, `numbakv.viz` and the serving stack
(`Model`, `Executor`, `Engine`, `DecodeFirstScheduler`, `Lockstep`) stay numba-free.
The first use of `CellCache`, `Step` or `device_info` picks the device (see
`numbakv.device`) and imports numba.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "CellCache": "numbakv.cache",
    "Step": "numbakv.step",
    "device_info": "numbakv.device",
    "CacheConfig": "numbakv.config",
    "Snapshot": "numbakv.snapshot",
    "CacheError": "numbakv.errors",
    "ConfigError": "numbakv.errors",
    "SequenceError": "numbakv.errors",
    "CapacityError": "numbakv.errors",
    "AllocationError": "numbakv.errors",
    "StepError": "numbakv.errors",
    "BindingError": "numbakv.errors",
    "TraceError": "numbakv.errors",
    "Model": "numbakv.model",
    "ModelConfig": "numbakv.model",
    "Sampling": "numbakv.sampling",
    "plan_slices": "numbakv.plan",
    "DecodeFirstScheduler": "numbakv.scheduler",
    "Task": "numbakv.scheduler",
    "Executor": "numbakv.executor",
    "Input": "numbakv.executor",
    "Output": "numbakv.executor",
    "Engine": "numbakv.engine",
    "Completion": "numbakv.engine",
    "TokenEvent": "numbakv.engine",
    "Lockstep": "numbakv.lockstep",
    "LockstepError": "numbakv.lockstep",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'numbakv' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
