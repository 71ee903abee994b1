"""numbakv.testing: hold your own KV cache to numbakv's contract (docs/contract.md §12).

    CacheUnderTest   what a cache under test must answer (a `typing.Protocol`), and what
                     of a `Step` depends on the layout (SEMANTIC_FIELDS, LAYOUT_FIELDS)
    check_cache      random workloads against the reference (`decode`: one integer per op;
                     `kinds=(*KINDS, "reload")` picks their ops), shrunk to an op script on
                     failure; a `prefix` of ops before each, a `check` hook
    Op, run_script   one workload as an op script, run on both and compared after every op
                     (`Runner`): outcomes, state, a refusal changing nothing, stale steps,
                     the cache's own `check_invariants()`, a cell layout's K/V bytes
    Divergence       the AssertionError a difference raises (its `ops`, `index`, `config`)
    check_attention  your attention kernel (cells or paged layout: `CellsInputs`,
                     `PagedInputs`) against the solo oracle; NumPy only
    OpLog, replay    record a scheduler's verbs and steps through a proxy, save them, replay
                     them into any cache (shrunk by delta debugging on a difference);
                     `numbakv replay OPLOG --against module:factory`; `trace_ops` reads
                     the same ops from a trace of `Recorder(cache, every_verb=True)`

Imports no numba, and nothing beyond numbakv's own dependencies.
"""

from numbakv.testing.attention import attention_cases, check_attention
from numbakv.testing.attention_types import (
    AttentionCase,
    AttentionCheckResult,
    CellsInputs,
    PagedInputs,
)
from numbakv.testing.check import DEFAULT_CONFIGS, QUANTIZED_CONFIGS, check_cache
from numbakv.testing.coverage import Coverage
from numbakv.testing.from_trace import trace_ops
from numbakv.testing.hazards import HAZARDS
from numbakv.testing.op import Op
from numbakv.testing.oplog import OpLog
from numbakv.testing.oplog_file import load_ops
from numbakv.testing.ops import Divergence, Runner, run_script, script
from numbakv.testing.protocol import LAYOUT_FIELDS, SEMANTIC_FIELDS, CacheUnderTest, StepLike
from numbakv.testing.refusals import REFUSALS
from numbakv.testing.replay import replay
from numbakv.testing.shrink import shrink_ops
from numbakv.testing.workloads import KINDS, Swarm, decode

__all__ = [
    "DEFAULT_CONFIGS",
    "HAZARDS",
    "KINDS",
    "LAYOUT_FIELDS",
    "QUANTIZED_CONFIGS",
    "REFUSALS",
    "SEMANTIC_FIELDS",
    "AttentionCase",
    "AttentionCheckResult",
    "CacheUnderTest",
    "CellsInputs",
    "Coverage",
    "Divergence",
    "Op",
    "OpLog",
    "PagedInputs",
    "Runner",
    "StepLike",
    "Swarm",
    "attention_cases",
    "check_attention",
    "check_cache",
    "decode",
    "load_ops",
    "replay",
    "run_script",
    "script",
    "shrink_ops",
    "trace_ops",
]
