"""How fast is the NumPy reference cell cache (`numbakv.reference`)? Prints figures; asserts
nothing about timing.

    python -m benchmarks.reference steps            # about 20 s on 2 cores
    python -m benchmarks.reference steps --quick    # a few seconds
    python -m benchmarks.reference attend           # read_len ~60 000, width 256
    python -m benchmarks.reference attend --quick   # read_len ~6 000

    steps     decode throughput and capacity scaling of the step (`steps`), and a long run
              of small random steps with churn (`long_run`)
    attend    one `attend` at 65 536 cells, gathered against masked (`attend`)

The model shape the steps run below is here.
"""

N_KV_HEADS = 2
N_HEADS = 8
HEAD_DIM = 64


def windows_for(n_layers: int, window: int) -> tuple[int, ...]:
    """All global (window 0), or `window` on every second layer (on the only one if one)."""
    if window == 0:
        return (0,) * n_layers
    if n_layers == 1:
        return (window,)
    return tuple(window if layer % 2 else 0 for layer in range(n_layers))
