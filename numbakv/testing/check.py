"""`check_cache`: random workloads (hypothesis) run on the reference and a cache under test,
compared after every op; a failure is shrunk to a short op script that replays.

Needs hypothesis (`pip install numbakv[testing]`).
"""

from collections.abc import Callable, Sequence

from numbakv.config import CacheConfig
from numbakv.testing.ops import COMPARES, Check, Op, Runner

GROUPS = (1, 2, 4, 8)  # query heads per KV head of a step's attends (GQA)
DEFAULT_CONFIGS = (  # small: every refusal of docs/contract.md §2 within a few ops
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


# each verb's share of the drawn ops: steps most, clear least (and only of a cache half full)
VERB_DRAWS = ("step",) * 8 + ("seq_new", "seq_clone", "rewind") * 3 + ("seq_rm",) * 2 + ("clear",)
PICKS = 8  # an id is a pick in [0, PICKS): 0-3 any live id, 4-5 one of the two highest
# live ids, 6 any id in [0, max_seqs], 7 a hostile one (see `decode`)
HOSTILE_POSITIONS = (-1, 0.5)  # refused: a negative position, one that is not an integer
CODES = 2**64  # an op is drawn as one integer below this, read digit by digit (`decode`)


class Digits:
    """An op's integer read as digits of mixed radix: `take(n)` is the next one in [0, n).
    One integer per op keeps hypothesis fast (a draw costs ~0.5 ms) and shrinks well: a
    smaller integer is a simpler op (a step, of live ids, of fewer tokens)."""

    def __init__(self, code: int):
        self.code = code

    def take(self, n: int) -> int:
        self.code, digit = divmod(self.code, n)
        return digit


def hostile_ids(config: CacheConfig) -> tuple:
    """Ids no cache may take for a live one: negative, past max_seqs, not integers. Each is
    its own repr, so a printed script replays."""
    return (-1, -2, config.max_seqs + 1, 1.5, "0", None)


def decode(code: int, reference, config: CacheConfig) -> Op:
    """The op of `code` for the present state of `reference` (anything with `live_seqs`,
    `pos(seq)` and `used_cells`: the reference cache, or a table's view of itself).

    Ids: 3 in 4 live (any, or one of the two highest, so that ids past 63 carry tokens when
    they are live), else any id in [0, max_seqs] (max_seqs is never live) or a hostile one
    (`hostile_ids`). Positions and `upto`: from the end down to 0, one past the end,
    sometimes -1 or 0.5. Steps: any ids, a prefill of one sequence beside one decode token
    of others (in either order or interleaved), one decode token of each of several
    sequences, or an empty declaration; up to one token too many; width the declared
    count, one more, or any in [0, max_width + 1] (too narrow, padded, too wide); 1, 2, 4
    or 8 query heads per KV head; mode gathered or masked. `clear` only when half the cells
    are used."""
    digits, live = Digits(code), list(reference.live_seqs)

    def seq():
        pick = digits.take(PICKS)
        if live and pick < 4:  # counted from the highest, so that a used-up code gives it
            return live[-1 - digits.take(len(live))]
        if live and pick < 6:
            return live[-1 - digits.take(min(2, len(live)))]
        if pick < 7:
            return digits.take(config.max_seqs + 1)
        hostile = hostile_ids(config)
        return hostile[digits.take(len(hostile))]

    verb = VERB_DRAWS[digits.take(len(VERB_DRAWS))]
    if verb == "clear" and 2 * reference.used_cells < config.capacity:
        verb = "step"
    if verb == "step" and not live:
        verb = "seq_new"  # an empty cache opens a sequence before any step
    if verb in ("seq_new", "clear"):
        return Op(verb)
    if verb == "step":
        return _step(digits, seq, live, config)
    target = seq()
    if verb == "seq_rm":
        return Op(verb, (target,))
    if verb == "seq_clone" and digits.take(2):
        return Op(verb, (target, None))
    end = reference.pos(target) if target in live else config.max_seq_len
    back = digits.take(end + 2)
    position = end - back if back <= end else end + 1  # the end, down to 0, one past the end
    if digits.take(8) == 7:
        position = HOSTILE_POSITIONS[digits.take(len(HOSTILE_POSITIONS))]
    return Op(verb, (target, position))


def _step(digits: Digits, seq: Callable[[], object], live: list[int], config: CacheConfig) -> Op:
    """A step op (see `decode`): its shape, mode, count, width and group, its ids, then the
    seed of its K/V and queries (the digits read last; 0 once the code is used up)."""
    shape = digits.take(16)  # 0-7 any ids, 8-11 a prefill beside decodes, 12-14 decodes, 15 none
    mode = ("masked",) if digits.take(2) else ()
    n = 1 + digits.take(config.max_width + 1)
    width_kind, group = digits.take(4), GROUPS[digits.take(len(GROUPS))]
    if shape < 8:
        ids = [seq() for _ in range(n)]
    elif shape < 12:
        ids = _prefill(digits, seq(), live, n)
    elif shape < 15:
        ids = _from_the_top(live, digits.take(len(live)))[:n]
    else:
        ids = []
    width = (None, len(ids), len(ids) + 1, digits.take(config.max_width + 2))[width_kind]
    return Op("step", (tuple(ids), width, group, digits.take(2**16), *mode))


def _prefill(digits: Digits, focus, live: list[int], n: int) -> list:
    """n tokens: a prefill of `focus` and one decode token of each of some other live ids,
    the prefill first, the decodes first, or a decode token after each prefill token."""
    others = [s for s in live if s != focus]
    others = _from_the_top(others, digits.take(len(others)) if others else 0)
    decodes = others[: digits.take(min(n, len(others) + 1))]
    prefill = [focus] * (n - len(decodes))
    order = digits.take(3)
    if order < 2:
        return prefill + decodes if order == 0 else decodes + prefill
    ids = []
    for i, token in enumerate(prefill):
        ids += [token, *decodes[i : i + 1]]
    return ids + decodes[len(prefill) :]


def _from_the_top(ids: list[int], skip: int) -> list[int]:
    """`ids` from the highest down, starting `skip` below the highest and wrapping round."""
    down = ids[::-1]
    return down[skip:] + down[:skip]


def check_cache(
    factory: Callable[[CacheConfig], object],
    *,
    compare: str = "semantic",
    configs: Sequence[CacheConfig] | None = None,
    max_examples: int = 100,
    max_ops: int = 30,
    seed: int | None = None,
    tolerance: float | None = None,
    prefix: Sequence[Op] | Callable[[CacheConfig], Sequence[Op]] = (),
    check: Check | None = None,
) -> None:
    """Holds `factory(config)` (a `CacheUnderTest`) to the reference on random workloads.

    factory      : makes an empty cache of a `CacheConfig` (a class such as
                   `numbakv.CellCache`, or your adapter)
    compare      : "semantic" for any layout, "table" for a cell layout (see `run_script`)
    configs      : the configs to draw from (default DEFAULT_CONFIGS: GQA, windows at and
                   around the history, float32 and float16, growth, full caches)
    max_examples : workloads to run, each of 1 to `max_ops` drawn ops (uniformly; `decode`)
    seed         : fixes hypothesis's draws (None: derandomized, the same every run)
    tolerance    : of attention outputs (see `run_script`); default by the storage dtype
    prefix       : ops run before every workload and again after each `clear`, so that the
                   state they make holds throughout (ids parked so that the ids under test
                   are past 63, sequences open); or a function of the config giving them.
                   Each op's outcome is compared, the rest after its last op (`Runner.setup`)
    check        : a hook called after every op (see `run_script`), for a layout's own state

    Returns when every workload agreed; otherwise raises `Divergence` (an AssertionError)
    whose message holds the shrunk op script (the prefix included), the config and the
    first difference.
    """
    hypothesis = hypothesis_or_error()
    if compare not in COMPARES:
        raise ValueError(f"compare={compare!r}: give one of {COMPARES}")
    configs = list(configs or DEFAULT_CONFIGS)
    st = hypothesis.strategies
    which, code = st.integers(0, len(configs) - 1), st.integers(0, CODES - 1)

    @hypothesis.settings(
        max_examples=max_examples, deadline=None, database=None, print_blob=False,
        suppress_health_check=list(hypothesis.HealthCheck), derandomize=seed is None,
    )  # fmt: skip
    @hypothesis.given(st.data())
    def workloads(data) -> None:
        config = configs[data.draw(which, label="config")]
        start = list(prefix(config) if callable(prefix) else prefix)
        runner = Runner(factory, config, compare, tolerance=tolerance, check=check)
        runner.setup(start)
        for _ in range(data.draw(st.integers(1, max_ops), label="ops")):
            op = decode(data.draw(code), runner.reference, config)
            runner.run(op)
            if op.verb == "clear":
                runner.setup(start)

    if seed is not None:
        workloads = hypothesis.seed(seed)(workloads)
    workloads()
