"""The traces of `benchmarks.prefix_cache`, and what an ideal cache would hit on them.

Four workload shapes, each a deterministic list of `Entry`s (token ids in [0, 256), drawn
by `numpy.random.default_rng(seed)`), lengths chosen so that shared prefixes do not end on
16-token boundaries:

    shared system   a few system prompts (517, 1203, 1999 tokens), each prompt one of them
                    (the shorter ones likelier) + a user message
    multi-turn      conversations, taken in turns round-robin; each turn's prompt is the
                    previous turn's prompt + the model's answer to it + a new user message
                    (an `Entry` with `after`, built when the answer exists)
    few-shot        an instruction (301 tokens) + a few examples from a pool (the popular
                    ones likelier, in pool order) + a query
    tree-of-thought one stem (307 tokens), every node branching in two: each node's
                    prompt is its parent's prompt + a continuation, breadth first

The baselines run over a trace of (prompt, cells) per request, in submission order: `cells`
are the tokens whose K/V a finished request leaves (its prompt and every generated token
but the last, which was never fed back):

    `trie_hits`   the tokens each prompt shares with any earlier request's cells (an
                  unbounded cache at token granularity), at most len(prompt) - 1
    `vllm_hits`   vLLM's rule: 16 x the leading full 16-token blocks whose hash chain (all
                  tokens up to the block's end) an earlier request's cells hold, at most
                  (len(prompt) - 1) // 16 blocks
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BLOCK = 16  # vLLM's block size
VOCAB = 256
Trace = list[tuple[list[int], list[int]]]  # per request: (prompt, the cells it leaves)


@dataclass(frozen=True)
class Entry:
    """A request of a trace: `tokens` is its prompt, or with `after` (the index of an
    earlier entry) what follows that entry's prompt and answer."""

    tokens: list[int]
    after: int | None = None


@dataclass(frozen=True)
class Workload:
    """A named trace of `entries`, each request generating `max_new_tokens`."""

    name: str
    entries: list[Entry]
    max_new_tokens: int

    def prompt(self, i: int, answers: Sequence[list[int] | None]) -> list[int]:
        """Entry i's prompt once the answers (generated tokens) of the entries it follows
        are known."""
        entry = self.entries[i]
        if entry.after is None:
            return entry.tokens
        return self.prompt(entry.after, answers) + answers[entry.after] + entry.tokens

    def placeholder_trace(self) -> Trace:
        """The trace with every answer replaced by ids >= VOCAB, distinct per request: the
        same hits as the real trace unless the model repeats a prompt's tokens by chance
        (for sizing the pool before anything ran)."""
        n = self.max_new_tokens
        answers = [list(range(VOCAB + i * n, VOCAB + (i + 1) * n)) for i in range(len(self))]
        prompts = [self.prompt(i, answers) for i in range(len(self))]
        return [(p, p + a[:-1]) for p, a in zip(prompts, answers, strict=True)]

    @property
    def longest(self) -> int:
        """Positions the longest request takes: its prompt and new tokens."""
        return max(len(p) for p, _ in self.placeholder_trace()) + self.max_new_tokens

    def __len__(self) -> int:
        return len(self.entries)


def tokens(rng: np.random.Generator, low: int, high: int) -> list[int]:
    """Between `low` and `high` (inclusive) random token ids."""
    return rng.integers(0, VOCAB, int(rng.integers(low, high + 1))).tolist()


def shared_system(rng: np.random.Generator, n: int) -> list[Entry]:
    systems = [rng.integers(0, VOCAB, length).tolist() for length in (517, 1203, 1999)]
    picks = rng.choice(len(systems), n, p=[0.6, 0.25, 0.15])
    return [Entry(systems[k] + tokens(rng, 8, 64)) for k in picks]


def multi_turn(rng: np.random.Generator, n_chats: int, n_turns: int) -> list[Entry]:
    """Turn t of chat c is entry t * n_chats + c."""
    entries = [Entry(tokens(rng, 40, 200)) for _ in range(n_chats)]
    for i in range(n_chats, n_chats * n_turns):
        entries.append(Entry(tokens(rng, 10, 60), after=i - n_chats))
    return entries


def few_shot(rng: np.random.Generator, n: int, n_examples: int = 32) -> list[Entry]:
    instruction = rng.integers(0, VOCAB, 301).tolist()
    examples = [tokens(rng, 40, 120) for _ in range(n_examples)]
    popularity = 1 / np.arange(1, n_examples + 1)
    entries = []
    for _ in range(n):
        k = int(rng.integers(3, 7))
        picked = np.sort(rng.choice(n_examples, k, replace=False, p=popularity / popularity.sum()))
        shots = [t for j in picked for t in examples[j]]
        entries.append(Entry(instruction + shots + tokens(rng, 10, 40)))
    return entries


def tree_of_thought(rng: np.random.Generator, branching: int, depth: int) -> list[Entry]:
    level = [rng.integers(0, VOCAB, 307).tolist()]
    entries = [Entry(level[0])]
    for _ in range(depth):
        level = [p + tokens(rng, 20, 40) for p in level for _ in range(branching)]
        entries += [Entry(p) for p in level]
    return entries


def workloads(quick: bool, seed: int = 0) -> list[Workload]:
    """The four shapes, hundreds of requests each (tens with `quick`)."""
    rng = np.random.default_rng(seed)
    if quick:
        shapes = [
            shared_system(rng, 24), multi_turn(rng, 6, 4), few_shot(rng, 24),
            tree_of_thought(rng, 2, 3),
        ]  # fmt: skip
    else:
        shapes = [
            shared_system(rng, 200), multi_turn(rng, 32, 8), few_shot(rng, 200),
            tree_of_thought(rng, 2, 7),
        ]  # fmt: skip
    names = ("shared system", "multi-turn", "few-shot", "tree-of-thought")
    return [Workload(name, entries, 16) for name, entries in zip(names, shapes, strict=True)]


def trie_hits(trace: Trace) -> tuple[list[int], int]:
    """(each prompt's hit, the distinct cells those hits read: what must stay cached for an
    unbounded cache's hit rate), by a trie of every earlier request's cells."""
    root: dict = {}
    hits, n_read = [], 0
    for prompt, cells in trace:
        node, hit = root, 0
        while hit < len(prompt) - 1 and prompt[hit] in node:
            node = node[prompt[hit]]
            n_read += not node.get(None, False)
            node[None] = True  # read by a hit
            hit += 1
        hits.append(hit)
        node = root
        for token in cells:
            node = node.setdefault(token, {})
    return hits, n_read


def vllm_hits(trace: Trace) -> list[int]:
    """Each prompt's hit under vLLM's rule (full blocks of a hash chain)."""
    seen: set[int] = set()
    hits = []
    for prompt, cells in trace:
        chain = block_chain(prompt)[: (len(prompt) - 1) // BLOCK]
        n = next((i for i, h in enumerate(chain) if h not in seen), len(chain))
        hits.append(BLOCK * n)
        seen.update(block_chain(cells))
    return hits


def block_chain(tokens: list[int]) -> list[int]:
    """The hash of each full block chained with the hash before it."""
    chain, h = [], 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        h = hash((h, *tokens[end - BLOCK : end]))
        chain.append(h)
    return chain
