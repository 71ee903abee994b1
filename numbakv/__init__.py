"""numbakv: a cell-layout KV cache for numba.cuda, with a NumPy reference.

    numbakv.core       the contract's shared types and checks: errors, formats, config, checks,
                       snapshot, observer hook, strict .npz reading, saved sequences, arrays
    numbakv.reference  the oracle: the NumPy reference cell cache (no numba)
    numbakv.cache      the device cell cache: host table, pool, buffers, kernels, captures
    numbakv.device_model  the serving model's forward on the device (numba.cuda)
    numbakv.serve      model, sampling, scheduler, executor, engine, lockstep (no numba)
    numbakv.trace      recording a cache's table over a workload, and its file (no numba)
    numbakv.viz        occupancy pictures (no numba)
    numbakv.integrations  other libraries' models served through numbakv (transformers)
    numbakv.testing    the conformance kit: hold a cache or a kernel of yours to the contract
    numbakv.cli        the `numbakv` command line: demo, viz, replay

Importing this package imports no numba: names are resolved on first use, so everything
but the device cache and the device model stays numba-free. The first use of `CellCache`,
`Step`, `StepGraph`, `DeviceModel` or `device_info` picks the device
(`numbakv.cache.device`) and imports numba.cuda.
"""

from importlib import import_module
from pathlib import Path

from numbakv import _checkout

__version__ = "1.1.5"

_EXPORTS = {
    "CellCache": "numbakv.cache.cellcache",
    "Step": "numbakv.cache.step",
    "Bindings": "numbakv.cache.bindings",
    "StepGraph": "numbakv.cache.graph",
    "DeviceModel": "numbakv.device_model.model",
    "device_info": "numbakv.cache.cuda",
    "CacheConfig": "numbakv.core.config",
    "bits_per_value": "numbakv.core.formats",
    "Snapshot": "numbakv.core.snapshot",
    "SeqState": "numbakv.core.seq_state",
    "CacheError": "numbakv.core.errors",
    "ConfigError": "numbakv.core.errors",
    "SequenceError": "numbakv.core.errors",
    "CapacityError": "numbakv.core.errors",
    "AllocationError": "numbakv.core.errors",
    "StepError": "numbakv.core.errors",
    "BindingError": "numbakv.core.errors",
    "TraceError": "numbakv.core.errors",
    "StateError": "numbakv.core.errors",
    "ObserverError": "numbakv.core.errors",
    "DistributedError": "numbakv.core.errors",
    "Recorder": "numbakv.trace.recorder",
    "Trace": "numbakv.trace.frames",
    "load_trace": "numbakv.trace.frames",
    "Model": "numbakv.serve.model",
    "ModelConfig": "numbakv.serve.model",
    "ByteTokenizer": "numbakv.serve.tokenizer",
    "Sampling": "numbakv.serve.sampling",
    "plan_slices": "numbakv.serve.plan",
    "DecodeFirstScheduler": "numbakv.serve.scheduler",
    "Task": "numbakv.serve.scheduler",
    "Executor": "numbakv.serve.executor",
    "Input": "numbakv.serve.batch",
    "Output": "numbakv.serve.batch",
    "ForwardCounts": "numbakv.serve.graphs",
    "EngineMetrics": "numbakv.serve.requests",
    "SessionExecutor": "numbakv.serve.protocol",
    "ServedModel": "numbakv.serve.models",
    "CapturedModel": "numbakv.serve.models",
    "ModelShape": "numbakv.serve.models",
    "Engine": "numbakv.serve.engine",
    "Completion": "numbakv.serve.requests",
    "TokenEvent": "numbakv.serve.requests",
    "Lockstep": "numbakv.serve.lockstep",
    "LockstepError": "numbakv.serve.lockstep",
    "PrefixCache": "numbakv.serve.prefix",
    "KVEventsConfig": "numbakv.serve.kv_events",
}

__all__ = sorted(_EXPORTS)

_checkout.install(Path(__file__).resolve().parent)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'numbakv' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
