"""`check_cache`: random workloads (hypothesis) run on the reference and a cache under test,
compared after every op; a failure is shrunk to a short op script that replays.

Needs hypothesis (`pip install numbakv[testing]`).
"""

from collections.abc import Callable, Sequence

from numbakv.config import CacheConfig
from numbakv.testing.ops import COMPARES, Op, Runner

GROUPS = (1, 2, 4, 8)  # query heads per KV head of a step's attends (GQA)
DEFAULT_CONFIGS = (  # small: every refusal of SPEC §2 within a few ops
    CacheConfig(n_layers=2, n_kv_heads=2, head_dim=8, windows=(0, 3), capacity=24,
                max_width=4, max_seqs=4, max_seq_len=10, initial_cells=4),
    CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, windows=(2,), capacity=16,
                max_width=5, max_seqs=3, max_seq_len=12, initial_cells=2, dtype="float16"),
    CacheConfig(n_layers=2, n_kv_heads=2, head_dim=4, windows=(4, 0), capacity=40,
                max_width=6, max_seqs=5, max_seq_len=8, initial_cells=8),
)  # fmt: skip


def hypothesis_or_error():
    """The hypothesis module, or ImportError naming the extra that installs it."""
    try:
        import hypothesis
    except ImportError as error:
        raise ImportError(
            "numbakv.testing.check_cache needs hypothesis: pip install 'numbakv[testing]'"
        ) from error
    return hypothesis


# each verb's share of the drawn ops: steps most, clear least
VERB_DRAWS = ("step",) * 8 + ("seq_new", "seq_clone", "rewind") * 3 + ("seq_rm",) * 2 + ("clear",)
PICKS = 16  # an id is a pick in [0, PICKS): 3 in 4 name a live id, the rest any id
CODES = 2**48  # an op is drawn as one integer below this, read digit by digit (`decode`)


class Digits:
    """An op's integer read as digits of mixed radix: `take(n)` is the next one in [0, n).
    One integer per op keeps hypothesis fast (a draw costs ~0.5 ms) and shrinks well: a
    smaller integer is a simpler op (a step, of live ids, of fewer tokens)."""

    def __init__(self, code: int):
        self.code = code

    def take(self, n: int) -> int:
        self.code, digit = divmod(self.code, n)
        return digit


def decode(code: int, reference, config: CacheConfig) -> Op:
    """The op of `code` for the reference's present state: ids mostly live (sometimes any id
    in [0, max_seqs]: refusals), positions and upto up to one past the end, steps of
    decodes, chunked prefills and both interleaved, too wide ones, padding, and 1, 2, 4 or
    8 query heads per KV head."""
    digits, live = Digits(code), list(reference.live_seqs)

    def seq() -> int:
        pick = digits.take(PICKS)
        if live and pick < PICKS * 3 // 4:
            return live[pick % len(live)]
        return pick % (config.max_seqs + 1)  # max_seqs is never live

    verb = VERB_DRAWS[digits.take(len(VERB_DRAWS))]
    if verb == "step" and not live:
        verb = "seq_new"  # an empty cache opens a sequence before any step
    if verb in ("seq_new", "clear"):
        return Op(verb)
    if verb == "step":
        ids = tuple(seq() for _ in range(1 + digits.take(config.max_width + 1)))
        width = (None, len(ids), len(ids) + 1)[digits.take(3)]  # the last pads a row
        return Op("step", (ids, width, GROUPS[digits.take(len(GROUPS))], digits.take(2**16)))
    target = seq()
    if verb == "seq_rm":
        return Op(verb, (target,))
    end = reference.pos(target) if target in live else config.max_seq_len
    position = end - digits.take(end + 2) + 1  # from one past the end down to 0
    if verb == "seq_clone" and digits.take(2):
        return Op(verb, (target, None))
    return Op(verb, (target, max(position, 0)))


def check_cache(
    factory: Callable[[CacheConfig], object],
    *,
    compare: str = "semantic",
    configs: Sequence[CacheConfig] | None = None,
    max_examples: int = 100,
    max_ops: int = 30,
    seed: int | None = None,
    tolerance: float | None = None,
) -> None:
    """Holds `factory(config)` (a `CacheUnderTest`) to the reference on random workloads.

    factory      : makes an empty cache of a `CacheConfig` (a class such as
                   `numbakv.CellCache`, or your adapter)
    compare      : "semantic" for any layout, "table" for a cell layout (see `run_script`)
    configs      : the configs to draw from (default DEFAULT_CONFIGS: GQA, windows at and
                   around the history, float32 and float16, growth, full caches)
    max_examples : workloads to run, each of 1 to `max_ops` ops
    seed         : fixes hypothesis's draws (None: derandomized, the same every run)
    tolerance    : of attention outputs (see `run_script`); default by the storage dtype

    Returns when every workload agreed; otherwise raises `Divergence` (an AssertionError)
    whose message holds the shrunk op script, the config and the first difference.
    """
    hypothesis = hypothesis_or_error()
    if compare not in COMPARES:
        raise ValueError(f"compare={compare!r}: give one of {COMPARES}")
    configs = list(configs or DEFAULT_CONFIGS)
    st = hypothesis.strategies
    which = st.integers(0, len(configs) - 1)
    codes = st.lists(st.integers(0, CODES - 1), min_size=1, max_size=max_ops)

    @hypothesis.settings(
        max_examples=max_examples, deadline=None, database=None, print_blob=False,
        suppress_health_check=list(hypothesis.HealthCheck), derandomize=seed is None,
    )  # fmt: skip
    @hypothesis.given(st.data())
    def workloads(data) -> None:
        config = configs[data.draw(which, label="config")]
        runner = Runner(factory, config, compare, tolerance=tolerance)
        for code in data.draw(codes, label="ops"):
            runner.run(decode(code, runner.reference, config))

    if seed is not None:
        workloads = hypothesis.seed(seed)(workloads)
    workloads()
