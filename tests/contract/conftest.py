"""The contract tests run once per implementation: `impl` is "reference" or "device"."""

from dataclasses import dataclass

import pytest

from numbakv import CellCache as DeviceCache
from numbakv.cache import device_allocator
from numbakv.reference import CellCache as ReferenceCache
from numbakv.reference.pool import numpy_allocator

from helpers import FlakyAllocator, small_config

KINDS = {"reference": (ReferenceCache, numpy_allocator), "device": (DeviceCache, device_allocator)}


@dataclass(frozen=True)
class Implementation:
    """One cache implementation, as the contract tests build it."""

    name: str

    def cache(self, allocator=None, **overrides):
        """A cache of `small_config(**overrides)`, with `allocator` when given."""
        cls, _ = KINDS[self.name]
        config = small_config(**overrides)
        return cls(config) if allocator is None else cls(config, allocator)

    def flaky_allocator(self, error=MemoryError) -> FlakyAllocator:
        """An allocator of this implementation's memory that refuses when told to."""
        return FlakyAllocator(error, base=KINDS[self.name][1])


@pytest.fixture(params=list(KINDS))
def impl(request) -> Implementation:
    return Implementation(request.param)


@pytest.fixture
def cache(impl):
    """An empty cache of `small_config()`: 2 layers (windows 0 and 2), 16 cells, 4 ids."""
    return impl.cache()
