"""The one module that imports `numba.cuda`: every other module takes `cuda` from here.

The device is chosen first (`numbakv.cache.device`, which sets numba's simulator flag
from NUMBAKV_DEVICE before numba is imported), so a move to another CUDA binding for
Python is a change to this file. Here too: `device_info`, the driver's out-of-memory
error the pool turns into `AllocationError`, a device array over a DLPack export
(`wrap_export`), a device array lent from a pool's block (`lend`), the two cuda.core
calls a CUDA graph needs, `asm_loader` (an inline-PTX load of one array row, the one
way numba reaches a 128-bit load: `kernels.wide`), and, on the simulator, the fixes of
`numbakv.cache.simulator`, installed at import.
"""

import weakref

import numpy as np

from numbakv.cache.device import IS_SIMULATOR, MODE
from numbakv.core.arrays import Exported, host_view, storage_dtype

from numba import cuda  # isort: skip  (only after the device module set NUMBA_ENABLE_CUDASIM)

if IS_SIMULATOR:
    from numba.cuda.simulator.api import stream as STREAM_TYPE  # the class of its streams

    from numbakv.cache import simulator

    simulator.install()
    DRIVER_ERRORS: tuple[type[BaseException], ...] = ()

    # the simulator has no libdevice (its functions return None): NumPy's view is the same cast
    def float_as_int(x):
        """The bits of float32 x as an int32."""
        return np.float32(x).view(np.int32)

    def int_as_float(bits):
        """The float32 whose bits are int32 `bits`."""
        return np.int32(bits).view(np.float32)

    def mul_rn(x, y):
        """x * y in float32, rounded once (never fused into an fma on a GPU)."""
        return np.float32(np.float32(x) * np.float32(y))

    def add_rn(x, y):
        """x + y in float32, rounded once (never fused into an fma on a GPU)."""
        return np.float32(np.float32(x) + np.float32(y))

else:  # out of device memory comes as the driver's API error
    from numba.cuda.cudadrv.driver import CudaAPIError
    from numba.cuda.cudadrv.driver import Stream as STREAM_TYPE  # noqa: F401
    from numba.cuda.libdevice import fadd_rn as add_rn  # noqa: F401
    from numba.cuda.libdevice import float_as_int, int_as_float  # noqa: F401
    from numba.cuda.libdevice import fmul_rn as mul_rn  # noqa: F401

    DRIVER_ERRORS = (CudaAPIError,)

    def _row_pointer(context, builder, array_type, array, row, offset):
        """The address of element `offset` of row `row` of an array whose rows are its first
        axis (int32 row and offset >= 0, a row's byte stride below 2^32): one 32 x 32 -> 64
        bit multiply, where numba's indexing multiplies in 64 bits and checks the sign."""
        from llvmlite import ir

        ary = context.make_array(array_type)(context, builder, value=array)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        stride = builder.zext(builder.trunc(builder.extract_value(ary.strides, 0), i32), i64)
        item = context.get_abi_sizeof(context.get_data_type(array_type.dtype))
        start = builder.mul(builder.zext(row, i64), stride, flags=["nuw"])  # mul.wide.u32
        start = builder.add(start, builder.mul(builder.zext(offset, i64), ir.Constant(i64, item)))
        byte = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
        element = context.get_data_type(array_type.dtype).as_pointer()
        return builder.bitcast(builder.gep(byte, [start], inbounds=True), element)

    def row_item():
        """An intrinsic `f(array, row, offset) -> array.dtype`: element `offset` of row `row`
        (the flat index within the row, int32), loaded with 32-bit index arithmetic."""
        from numba import types
        from numba.cuda.extending import intrinsic

        @intrinsic
        def item(typingctx, array, row, offset):
            def codegen(context, builder, sig, args):
                ptr = _row_pointer(context, builder, sig.args[0], *args)
                return builder.load(ptr)

            if not isinstance(row, types.Integer) or not isinstance(offset, types.Integer):
                return None
            return array.dtype(array, types.int32, types.int32), codegen

        return item

    def row_store():
        """An intrinsic `f(array, row, offset, value)`: stores value (cast to the array's
        dtype) at element `offset` of row `row`, with `row_item`'s addressing."""
        from numba import types
        from numba.cuda.extending import intrinsic

        @intrinsic
        def put(typingctx, array, row, offset, value):
            def codegen(context, builder, sig, args):
                ptr = _row_pointer(context, builder, sig.args[0], *args[:3])
                item = context.cast(builder, args[3], sig.args[3], sig.args[0].dtype)
                builder.store(item, ptr)

            if not isinstance(row, types.Integer) or not isinstance(offset, types.Integer):
                return None
            return types.void(array, types.int32, types.int32, value), codegen

        return put

    def int32_quotient():
        """An intrinsic `f(a, b) -> int32`: a // b of non-negative int32s in one 32-bit
        division (numba divides int32s in 64 bits: a call on a GPU)."""
        from numba import types
        from numba.cuda.extending import intrinsic

        @intrinsic
        def quotient(typingctx, a, b):
            def codegen(context, builder, sig, args):
                x, y = (context.cast(builder, v, t, types.int32)
                        for v, t in zip(args, sig.args, strict=True))  # fmt: skip
                return builder.udiv(x, y)

            return types.int32(a, b), codegen

        return quotient

    def asm_function(asm: str, constraints: str, out_type: str, in_type: str | tuple[str, ...]):
        """An intrinsic `f(x: in_type) -> out_type` (or `f(x, y)`, `f(x, y, z)` for a tuple of
        2 or 3 input types) that runs the inline PTX `asm` ($0 the result, $1 .. the
        arguments) with `constraints` (e.g. "=f,r"); pure, so the compiler may move or drop
        it."""
        from llvmlite import ir
        from numba import types
        from numba.cuda.extending import intrinsic

        result_type = getattr(types, out_type)
        names = (in_type,) if isinstance(in_type, str) else in_type
        in_types = [getattr(types, t) for t in names]

        def codegen(context, builder, sig, args):
            values = [context.cast(builder, v, t, want)
                      for v, t, want in zip(args, sig.args, in_types, strict=True)]  # fmt: skip
            fn = ir.FunctionType(context.get_value_type(result_type), [v.type for v in values])
            return builder.call(ir.InlineAsm(fn, asm, constraints), values)

        if len(in_types) == 1:

            @intrinsic
            def function(typingctx, x):
                return result_type(x), codegen

        elif len(in_types) == 2:

            @intrinsic
            def function(typingctx, x, y):
                return result_type(x, y), codegen

        else:

            @intrinsic
            def function(typingctx, x, y, z):
                return result_type(x, y, z), codegen

        return function

    def asm_loader(asm: dict[str, tuple[str, int, str]]):
        """An intrinsic `f(array, row, offset, ok) -> UniTuple(out_type, n_out)` that runs the
        inline PTX of `asm[array's dtype name] = (text, n_out, out_type)` where `ok` is true:
        text writes outputs $0 .. $(n_out - 1), reads the address of element `offset` of row
        `row` (`row_item`'s addressing) as $A and guards each load with `@p`; where `ok` is
        false nothing is read and every output is 0 (a predicated load, no branch)."""
        from llvmlite import ir
        from numba import types
        from numba.cuda.extending import intrinsic

        @intrinsic
        def load(typingctx, array, row, offset, ok):
            if str(array.dtype) not in asm:
                return None  # no such load: a typing error names the arguments
            text, n_out, out_type = asm[str(array.dtype)]
            element = getattr(types, out_type)
            is_float = out_type.startswith("float")
            zero = "mov.f32 ${}, 0f00000000;" if is_float else "mov.b32 ${}, 0;"
            full = "\n".join(
                ["{ .reg .pred p;", f"setp.ne.s32 p, ${n_out + 1}, 0;"]
                + [zero.format(n) for n in range(n_out)]
                + [text.replace("$A", f"${n_out}"), "}"]
            )
            constraints = ",".join(["=f" if is_float else "=r"] * n_out + ["l", "r"])

            def codegen(context, builder, sig, args):
                ptr = _row_pointer(context, builder, sig.args[0], *args[:3])
                flag = context.cast(builder, args[3], sig.args[3], types.int32)
                value = context.get_value_type(element)
                returned = ir.LiteralStructType([value] * n_out) if n_out > 1 else value
                fn = ir.FunctionType(returned, [ptr.type, flag.type])
                result = builder.call(ir.InlineAsm(fn, full, constraints), [ptr, flag])
                if n_out == 1:  # one output is returned as itself, not as a struct
                    return context.make_tuple(builder, sig.return_type, [result])
                values = [builder.extract_value(result, n) for n in range(n_out)]
                return context.make_tuple(builder, sig.return_type, values)

            signature = types.UniTuple(element, n_out)(array, types.int32, types.int32, ok)
            return signature, codegen

        return load


def device_info() -> dict:
    """Which device is in use: {"mode": ..., "name": ..., "compute_capability": (major, minor)}."""
    if MODE == "gpu":
        device = cuda.get_current_device()
        return {
            "mode": MODE,
            "name": device.name.decode() if isinstance(device.name, bytes) else device.name,
            "compute_capability": device.compute_capability,
        }
    name = "numba CUDA simulator" if IS_SIMULATOR else "compile only (no GPU)"
    return {"mode": MODE, "name": name, "compute_capability": None}


def use_device(index: int) -> None:
    """Makes GPU `index` (modulo the GPUs this process sees) the current one: a rank of
    several on one machine takes its LOCAL_RANK's. The simulator and compile-only mode
    have one device, and ignore it."""
    if MODE == "gpu":
        cuda.select_device(int(index) % len(cuda.gpus))


def cuda_versions() -> dict[str, object]:
    """{"driver": ..., "runtime": ...}: the CUDA driver's and runtime's (NVRTC's) versions
    as numba reports them (a GPU, or compile mode with the toolkit's libraries)."""
    from numba.cuda.cudadrv import driver, runtime

    return {"driver": driver.driver.get_version(), "runtime": runtime.runtime.get_version()}


def ordering_event():
    """A CUDA event without timing, for ordering work (the simulator's takes no options)."""
    return cuda.event() if IS_SIMULATOR else cuda.event(timing=False)


def is_done(event) -> bool:
    """Whether the work before `event` has finished, without waiting (the simulator's work
    always has: it runs each launch and copy to completion before returning)."""
    return IS_SIMULATOR or event.query()


def wrap_export(exported: Exported):
    """A numba device array over a DLPack export's memory, no copy (bfloat16 as its uint16
    patterns); it holds the exporter alive. The simulator's device memory is host memory, so
    there the export's address is read as a host buffer (`arrays.host_view`)."""
    if IS_SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(host_view(exported))
    interface = {
        "shape": exported.shape,
        "strides": exported.strides,
        "typestr": storage_dtype(exported.dtype).str,
        "data": (exported.address, False),
        "version": 3,
    }
    return cuda.from_cuda_array_interface(interface, owner=exported.owner, sync=False)


class _Lent:
    """The owner of a lent array's memory (`lend`): alive while the array or any view of it
    is (each holds its owner), and holding the pool's block alive in turn."""

    def __init__(self, block):
        self.block = block


def lend(block, shape: tuple[int, ...], stream, on_return):
    """A C-contiguous device array of `shape` over the first bytes of the device array
    `block` (its dtype) on `stream`, no allocation; `on_return()` runs once it and every
    view of it are gone, so that a pool may lend the block again (`numbakv.cache.lending`)."""
    owner = _Lent(block)
    weakref.finalize(owner, on_return)
    interface = {
        "shape": tuple(shape),
        "strides": None,
        "typestr": block.dtype.str,
        "data": (device_address(block), False),
        "version": 3,
    }
    if IS_SIMULATOR:  # a NumPy array over the block whose base is the owner
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        owner.__array_interface__ = interface
        return FakeCUDAArray(np.asarray(owner), stream=stream)
    array = cuda.from_cuda_array_interface(interface, owner=owner, sync=False)
    array.stream = stream  # what its __cuda_array_interface__ names, as an allocation's
    return array


def device_address(array) -> int:
    """Where `array`'s data lives: its device pointer, or in the simulator its host buffer."""
    if IS_SIMULATOR:
        return array._ary.__array_interface__["data"][0]
    return array.__cuda_array_interface__["data"][0]


def stream_handle(stream) -> int:
    """The raw handle of a numba stream (0, 1, 2: the default streams)."""
    return 0 if IS_SIMULATOR else int(stream.__cuda_stream__()[1])


def begin_graph(stream):
    """A cuda.core GraphBuilder capturing `stream` (a numba stream, not a default one), begun
    in thread-local mode: an allocation or synchronous copy in this thread while it builds
    fails the capture instead of running outside the graph."""
    from cuda.core import Device, Stream

    Device(cuda.get_current_device().id).set_current()
    builder = Stream.from_handle(stream_handle(stream)).create_graph_builder()
    return builder.begin_building("thread_local")


def launch_graph(graph, stream) -> None:
    """Launches a completed cuda.core graph on the numba stream `stream`."""
    from cuda.core import Stream

    graph.launch(Stream.from_handle(stream_handle(stream)))
