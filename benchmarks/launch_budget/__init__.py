"""What one step of the device cache asks of numba.cuda, counted in the CUDA simulator
(`numbakv.testing.launches`), against the launch budget of docs/contract.md §8.1:

    declare_step + prepare_step  <= 1 copy, <= 1 launch, 0 allocations
    mask launches in the step    <= 1 when it has a masked attend or a mask() read, else 0
    each layer (write + attend)  <= 3 launches, 0 copies, 0 allocations, 0 synchronizations,
                                 with K, V and q device arrays and `out=` a device array
    mask() read on a step        0 allocations, <= 1 copy (the mask coming back)
    every launch and copy        on the step's stream, never the legacy default stream

    NUMBAKV_DEVICE=sim python -m benchmarks.launch_budget            # the table
    NUMBAKV_DEVICE=sim python -m benchmarks.launch_budget --check    # exit 1 past the budget

The budget and the steps measured are in `rules`, the cache they run on in `bench`, the
table in `__main__`; tests/cache/test_launch_budget.py asserts the same rules. Rows with
host inputs (NumPy K/V/q, no `out=`) are the contrast: the layer budget holds only for
device inputs.
"""
