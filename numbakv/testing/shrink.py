"""`shrink`: a failing op script made short — delta debugging removes ops (`shrink_ops`),
then each op is made simpler (fewer tokens, the declared width, one query head per KV head,
seed 0, no mode or scale), and again, until nothing changes or the budget of runs is spent.
NumPy only.
"""

from collections.abc import Callable, Iterator, Sequence

from numbakv.testing.op import Op

RUNS = 400  # the most scripts one shrink runs


def shrink(ops: Sequence[Op], fails: Callable[[Sequence[Op]], bool], runs: int = RUNS) -> list[Op]:
    """A short list of ops for which `fails` still holds (`fails(ops)` must): 1-minimal
    when the budget of `runs` calls of `fails` was enough."""
    seen: dict[tuple[Op, ...], bool] = {tuple(ops): True}

    def still_fails(candidate: Sequence[Op]) -> bool:
        key = tuple(candidate)
        if key not in seen:
            seen[key] = len(seen) <= runs and fails(candidate)  # past the budget: keep what is
        return seen[key]

    ops, changed = shrink_ops(ops, still_fails), True
    while changed:
        changed = False
        for i, op in enumerate(ops):
            simpler = next((o for o in simpler_ops(op)
                            if still_fails([*ops[:i], o, *ops[i + 1 :]])), None)  # fmt: skip
            if simpler is not None:
                ops[i], changed = simpler, True
        if changed:
            ops = shrink_ops(ops, still_fails)
    return ops


def simpler_ops(op: Op) -> Iterator[Op]:
    """Ops like `op`, each simpler in one way: for a step or declaration one token fewer,
    then the declared width, group 1, seed 0, no mode; a rewind to 0; an attend without
    scale or mode; a write of float32."""
    verb, args = op.verb, op.args
    if verb in ("step", "declare") and isinstance(args[0], tuple):
        ids = args[0]
        for i in range(len(ids)):
            yield Op(verb, (ids[:i] + ids[i + 1 :], *args[1:]))
    if verb == "step":
        ids, width, group, seed, *mode = args
        for simpler in ((ids, None, group, seed, *mode), (ids, width, 1, seed, *mode),
                        (ids, width, group, 0, *mode), (ids, width, group, seed)):  # fmt: skip
            if simpler != args:
                yield Op(verb, simpler)
    if verb == "rewind" and args[1] != 0:
        yield Op(verb, (args[0], 0))
    if verb == "attend":
        for simpler in ((*args[:4], None, args[5]), (*args[:5], None)):
            if simpler != args:
                yield Op(verb, simpler)
    if verb == "write" and len(args) == 4:
        yield Op(verb, args[:3])


def shrink_ops(ops: Sequence[Op], fails: Callable[[Sequence[Op]], bool]) -> list[Op]:
    """A 1-minimal sublist of `ops` (order kept) for which `fails` is still True: removing
    any one op of it makes `fails` False. Zeller's ddmin: try each of n chunks, then each
    complement, else split finer. ValueError when `fails(ops)` is False."""
    ops = list(ops)
    if not fails(ops):
        raise ValueError("shrink_ops: fails(ops) is False for the whole list; nothing to shrink")
    n = 2
    while len(ops) >= 2:
        size = -(-len(ops) // n)
        chunks = [ops[i : i + size] for i in range(0, len(ops), size)]
        complements = [
            [op for j, chunk in enumerate(chunks) if j != i for op in chunk]
            for i in range(len(chunks))
        ]
        smaller = next((c for c in chunks if fails(c)), None)
        if smaller is not None:
            ops, n = smaller, 2
            continue
        smaller = next((c for c in complements if len(chunks) > 2 and fails(c)), None)
        if smaller is not None:
            ops, n = smaller, max(n - 1, 2)
            continue
        if n >= len(ops):
            break
        n = min(2 * n, len(ops))
    return ops
