"""Where the counting wrappers go: the simulator's entry points, found where the lookups of
`cuda.device_array(...)`, `cuda.to_device(...)`, `array.copy_to_device(x, stream=s)` and
`kernel[grid, block, stream](...)` resolve, and how they are put in place and taken back.

A function is replaced in every loaded `numba.*` module that holds it, found by identity (so
`numba.cuda.to_device` and the simulator's own `devicearray.to_device` are both caught); a
method is replaced on the simulator's kernel, array, stream or event class.
"""

import sys

import numbakv.testing.launches.wrappers as wrap

ALLOCATORS = (  # the simulator's devicearray functions that allocate (to_device aside)
    "device_array",
    "device_array_like",
    "mapped_array",
    "pinned_array",
    "pinned_array_like",
    "pinned",
    "managed_array",
)
DEFAULT_STREAMS = ("default_stream", "legacy_default_stream", "per_thread_default_stream")
_ABSENT = object()  # a class attribute that did not exist before the patch
_installed: list[tuple[object, str, object]] = []  # (owner, name, original or _ABSENT)


def _plan() -> tuple[list[tuple[str, object, object]], list[tuple[type, str, object]]]:
    """(function patches [(name, original, replacement)], class patches [(class, name,
    replacement)]) of the simulator's entry points."""
    from numba.cuda.simulator import api, kernel
    from numba.cuda.simulator.cudadrv import devicearray

    functions = [
        (name, getattr(devicearray, name), wrap.allocation(name, getattr(devicearray, name)))
        for name in ALLOCATORS
        if hasattr(devicearray, name)
    ]
    to_device, synchronize = devicearray.to_device, api.synchronize
    functions.append(("to_device", to_device, wrap.to_device(to_device)))
    functions.append(("synchronize", synchronize, wrap.synchronization("synchronize", synchronize)))
    for name in DEFAULT_STREAMS:
        functions.append((name, getattr(api, name), wrap.default_stream(name, api.stream)))
    stream, event = api.stream, api.Event
    classes = [
        (stream, "__init__", wrap.made("streams", "stream", stream_kind="stream")),
        (stream, "synchronize", wrap.stream_synchronize(stream.synchronize)),
        (stream, "auto_synchronize", wrap.auto_synchronize(stream.__dict__["auto_synchronize"])),
        (event, "__init__", wrap.made("events", "event")),
        (event, "record", wrap.event_record(event.record)),
        (event, "wait", wrap.synchronization("event.wait", event.wait, takes_stream=True)),
        (event, "synchronize", wrap.synchronization("event.synchronize", event.synchronize)),
    ]
    array = devicearray.FakeCUDAArray
    classes += [(array, n, f) for n, f in wrap.array_methods(array, kernel).items()]
    launcher = kernel.FakeCUDAKernel
    classes += [(launcher, n, f) for n, f in wrap.kernel_methods(launcher, kernel, array).items()]
    return functions, classes


def _numba_modules() -> list:
    """Every loaded module of numba (each once: the simulator aliases some in sys.modules)."""
    seen, modules = set(), []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "numba" or name.startswith("numba.")):
            continue
        if id(module) not in seen:
            seen.add(id(module))
            modules.append(module)
    return modules


def install() -> None:
    """Puts every wrapper in place, remembering each original."""
    functions, classes = _plan()
    for module in _numba_modules():
        namespace = getattr(module, "__dict__", {})
        for name, original, replacement in functions:
            if namespace.get(name, _ABSENT) is original:
                _installed.append((module, name, original))
                setattr(module, name, replacement)
    for owner, name, replacement in classes:
        _installed.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, replacement)


def uninstall() -> None:
    """Puts every original back, in the reverse order of `install`."""
    while _installed:
        owner, name, original = _installed.pop()
        if original is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


def entry_points() -> dict[str, object]:
    """{"module:name" or "Class.name": object} of every place `install` patches, as it stands
    now (absent class attributes as None): equal before and after a counting block."""
    functions, classes = _plan()
    names = [name for name, _, _ in functions]
    found = {}
    for module in _numba_modules():
        namespace = getattr(module, "__dict__", {})
        for name in names:
            if name in namespace:
                found[f"{module.__name__}:{name}"] = namespace[name]
    for owner, name, _ in classes:
        found[f"{owner.__qualname__}.{name}"] = owner.__dict__.get(name)
    return found
