"""The error hierarchy of docs/contract.md §6, shared by both implementations (no numba import).

Every refused call raises one of these and changes nothing. Messages say what was
asked, what the limit or state was, and what to do.
"""


class CacheError(Exception):
    """Base class of every error numbakv raises on purpose."""


class ConfigError(CacheError):
    """A `CacheConfig` field is outside its bound."""


class SequenceError(CacheError):
    """A sequence id is not live, or a position is outside the sequence."""


class CapacityError(CacheError):
    """The cache is full: no free cell or no free sequence id for the request."""


class AllocationError(CapacityError):
    """The pool could not allocate storage to grow; the cache is as it was."""


class StepError(CacheError):
    """The step protocol was not followed: nothing declared, a stale `Step`, a bad shape."""


class BindingError(CacheError):
    """A recorded launch or captured graph refers to storage that has since moved."""


class TraceError(CacheError):
    """A trace file is corrupt, truncated, inconsistent or not a numbakv trace."""


class StateError(CacheError):
    """A saved sequence state (`SeqState`, its file) is damaged, inconsistent or not one."""


class DistributedError(CacheError):
    """Ranks of a process group disagree (their cell tables, at a digest), or one died or
    stalled past the group's timeout (docs/contract.md §15.2)."""


class ObserverError(Exception):
    """An observer raised after a verb had completed: the verb's change stands (this is
    not a refusal, so not a `CacheError`), every other observer still heard of it, and the
    observer's exception is the `__cause__`.

    event  : the verb's name
    result : what the verb returned (the new id, the prepared `Step`, or None)
    """

    def __init__(self, message: str, event: str, result=None):
        super().__init__(message)
        self.event = event
        self.result = result
