"""numbakv's benchmarks: commands that print figures, run from the checkout's root (where
`python -m` finds this checkout's numbakv first). Each takes `--help`; most take `--quick`.

    python -m benchmarks.gpu_check [--sim]         the one command for a GPU: versions,
                                                   bandwidth, attention against the oracle,
                                                   the decode step, the device model eager
                                                   and replayed, the launch budget, the
                                                   device tests (--sim: tiny, simulator)
    python -m benchmarks.attention [--quick]       decode attention: the cells each mode
                                                   visits, and on a GPU its bandwidth
    python -m benchmarks.host table|step|cache     a step's host cost: the host cell table,
                                                   check + placement, CellCache's host work
    python -m benchmarks.reference steps|attend    the NumPy reference: step throughput,
                                                   capacity scaling, a long run; one attend
    python -m benchmarks.serving [--quick]         continuous batching through the Engine
    python -m benchmarks.launch_budget [--check]   what a device step launches, copies and
                                                   allocates, against docs/contract.md §8.1
                                                   (on the simulator: NUMBAKV_DEVICE=sim)
    python -m benchmarks.recording overhead|large  what recording a trace costs
    python -m benchmarks.plots TRACE               what drawing a large trace's pictures costs
    python -m benchmarks.trace_fuzz                damaged trace files against load_trace

What they share (the machine header, tables, the timing loop) is in `common`. The counting
of device calls is `numbakv.testing.launches`; the trace fuzz harness and the scheduler
workload are test data, in tests/viz/.
"""
