"""`Op`: one operation of a workload, the unit every script, log and shrinker of the kit holds
(`numbakv.testing.ops` runs them; its docstring lists the verbs and their args)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One operation of a workload: `verb` with `args` (see `numbakv.testing.ops`)."""

    verb: str
    args: tuple = ()

    def __repr__(self) -> str:
        return f"Op({self.verb!r}, {self.args!r})" if self.args else f"Op({self.verb!r})"
