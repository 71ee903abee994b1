"""What a batch is made of: `Input`s in, `Output`s out, and the checks of a batch's inputs
(each refusal names the bad value; nothing has changed when one is raised)."""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from numbakv.core.errors import StepError
from numbakv.core.values import int_at_least, token_ids
from numbakv.serve.sampling import Sampling


@dataclass(frozen=True)
class Input:
    """Tokens of one session from `position` on.

    tokens : ints in [0, vocab_size), at least one
    sample : draw the session's next token from the logits after the last token
    forks  : per entry, clone the session after the last token and draw the clone's first
             token with that sampling (needs `sample`; see the module docstring)
    """

    session: int
    position: int
    tokens: Sequence[int]
    sample: bool = True
    forks: tuple[Sampling, ...] = ()


@dataclass(frozen=True)
class Output:
    """The result of one input: the logits after its last token ([vocab_size] float32), the
    token sampled from them (None when the input did not ask) and, per fork of the input,
    (the clone's session id, the clone's first token)."""

    session: int
    logits: np.ndarray = field(repr=False)
    token: int | None
    forks: tuple[tuple[int, int], ...] = ()


def checked_inputs(inputs, check_open, vocab_size: int) -> list[Input]:
    """`inputs` as a list of `Input`s with int sessions (open), int positions >= 0,
    token lists, bool `sample` and tuple forks, or the error refusing the batch."""
    if isinstance(inputs, Input | str) or not isinstance(inputs, Sequence):
        raise StepError(f"execute() takes a list of Inputs, got {inputs!r}; for one: [x]")
    if not inputs:
        raise StepError("execute() needs at least one input")
    return [_checked_input(x, check_open, vocab_size) for x in inputs]


def _checked_input(x: Input, check_open, vocab_size: int) -> Input:
    if not isinstance(x, Input):
        raise StepError(f"expected an Input, got {x!r}")
    session = check_open(x.session)
    name = f"session {session}'s tokens"
    tokens = token_ids(name, x.tokens, vocab_size, StepError)
    if not isinstance(x.sample, bool | np.bool_):
        raise StepError(f"session {session}: sample must be True or False, got {x.sample!r}")
    forks = x.forks
    if not isinstance(forks, tuple | list) or not all(isinstance(f, Sampling) for f in forks):
        raise StepError(f"session {session}: forks must be a tuple of Sampling, got {forks!r}")
    if forks and not x.sample:
        raise StepError(f"session {session}: an input with forks samples its token (sample=True)")
    position = int_at_least("position", x.position, 0)
    return Input(session, position, tokens, bool(x.sample), tuple(forks))
