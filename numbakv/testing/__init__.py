"""numbakv.testing: hold your own KV cache to numbakv's contract (SPEC §2-§8).

    CacheUnderTest   what a cache under test must answer (a `typing.Protocol`), and what
                     of a `Step` depends on the layout

Imports no numba and no hypothesis. The conformance checks that drive a cache with random
workloads against the reference (issue 14) build on this protocol.
"""

from numbakv.testing.protocol import LAYOUT_FIELDS, SEMANTIC_FIELDS, CacheUnderTest, StepLike

__all__ = ["LAYOUT_FIELDS", "SEMANTIC_FIELDS", "CacheUnderTest", "StepLike"]
