"""`Group`: the collectives tensor-parallel serving needs, over torch.distributed, each
counted (calls and bytes by kind) and each failure a `DistributedError` that names the
rank and what it was doing (docs/contract.md §15.2).

    group = init()                       # torchrun's environment; gloo on the CPU
    capacity = group.agreed_min(capacity)  # every rank's pool the same size
"""

import hashlib
import os
import pickle
from collections.abc import Callable
from datetime import timedelta

import numpy as np

from numbakv.core.errors import ConfigError, DistributedError
from numbakv.core.values import as_int, real

ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torchrun sets them


def init(timeout: float = 60.0) -> "Group":
    """The default process group as a `Group`, initialized from torchrun's environment
    unless the caller initialized it: gloo, and where torch sees GPUs NCCL for CUDA
    tensors too (`backend`; numbakv's own collectives are the CPU's); `timeout` (seconds)
    bounds every collective, so a rank that died or stalls makes the others raise
    `DistributedError`."""
    import torch
    import torch.distributed as dist

    timeout = real("timeout", timeout, ConfigError)
    if not 0.1 <= timeout <= 1e6:
        raise ConfigError(f"timeout={timeout} must lie in [0.1, 1e6] seconds")
    if not dist.is_initialized():
        missing = [name for name in ENVIRONMENT if name not in os.environ]
        if missing:
            raise ConfigError(
                f"torch.distributed is not initialized and {', '.join(missing)} are not set: "
                "launch with torchrun, or call torch.distributed.init_process_group first"
            )
        cuda = torch.cuda.is_available()
        if cuda:  # a GPU a rank, as the device cache takes it (`use_device`)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        dist.init_process_group(backend(cuda), timeout=timedelta(seconds=timeout))
    return Group()


def backend(cuda: bool) -> str:
    """torch.distributed's backend: gloo for CPU tensors (numbakv's calls, digests, states)
    and, with GPUs, NCCL for CUDA tensors (a transformers model's own all-reduces)."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


class Group:
    """Rank `rank` of `world` in torch.distributed's default group (initialized already),
    through the CPU (gloo). `counts`: kind -> [collectives, bytes this rank sent or
    received], for `benchmarks.distributed` and the tests that hold a step to its budget."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ConfigError(
                "torch.distributed is not initialized: call numbakv.distributed.init()"
            )
        self._torch, self._dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.counts: dict[str, list[int]] = {}

    def broadcast(self, value: object = None) -> object:
        """Rank 0's `value` on every rank (pickled: a size, then the bytes)."""
        size, buffer = self._packed(value) if self.rank == 0 else (self._size(), None)
        self._run("broadcast", lambda: self._dist.broadcast(size, 0))
        if self.rank:
            buffer = self._torch.empty(int(size), dtype=self._torch.uint8)
        self._run("broadcast", lambda: self._dist.broadcast(buffer, 0))
        self._count("broadcast", int(size) + 8)
        return value if self.rank == 0 else pickle.loads(buffer.numpy().tobytes())

    def peer(self, name: str, rank) -> int:
        """`rank` as another rank of the group, else ConfigError naming it."""
        rank = as_int(name, rank, ConfigError)
        if not 0 <= rank < self.world or rank == self.rank:
            raise ConfigError(
                f"{name}={rank}: expected another rank of this group, in [0, {self.world}) "
                f"and not {self.rank}"
            )
        return rank

    def send(self, value: object, dst: int) -> None:
        """`value` to rank `dst` (pickled: a size, then the bytes), which `receive`s it."""
        dst = self.peer("dst", dst)
        size, buffer = self._packed(value)
        self._run(f"send to rank {dst}", lambda: self._dist.send(size, dst))
        self._run(f"send to rank {dst}", lambda: self._dist.send(buffer, dst))
        self._count("send", int(size) + 8)

    def receive(self, src: int) -> object:
        """What rank `src` `send`s next."""
        src = self.peer("src", src)
        size = self._size()
        self._run(f"receive from rank {src}", lambda: self._dist.recv(size, src))
        buffer = self._torch.empty(int(size), dtype=self._torch.uint8)
        self._run(f"receive from rank {src}", lambda: self._dist.recv(buffer, src))
        self._count("receive", int(size) + 8)
        return pickle.loads(buffer.numpy().tobytes())

    def all_reduce_sum(self, partial: np.ndarray) -> np.ndarray:
        """The sum over ranks of `partial` (float32), the same on every rank."""
        tensor = self._torch.from_numpy(np.ascontiguousarray(partial, dtype=np.float32))
        self._run("all_reduce", lambda: self._dist.all_reduce(tensor))
        self._count("all_reduce", tensor.numel() * 4)
        return tensor.numpy()

    def agreed_min(self, value: int) -> int:
        """The least of every rank's `value` (a pool's capacity: ranks that size their pools
        apart would place tokens apart)."""
        tensor = self._torch.tensor([int(value)], dtype=self._torch.int64)
        self._run("agree", lambda: self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MIN))
        self._count("agree", 8)
        return int(tensor)

    def gathered(self, value: object) -> list:
        """Every rank's `value`, by rank (pickled once here: its bytes are what is gathered
        and counted)."""
        data, out = pickle.dumps(value), [None] * self.world
        self._run("all_gather", lambda: self._dist.all_gather_object(out, data))
        self._count("all_gather", len(data) * self.world)
        return [pickle.loads(part) for part in out]

    def _packed(self, value: object) -> tuple:
        """([1] int64 the size, [size] uint8 the bytes) of `value` pickled."""
        data = pickle.dumps(value)
        torch = self._torch
        return torch.tensor([len(data)], dtype=torch.int64), torch.frombuffer(
            bytearray(data), dtype=torch.uint8
        )

    def _size(self):
        """A [1] int64 tensor a size is received into."""
        return self._torch.zeros(1, dtype=self._torch.int64)

    def _run(self, what: str, collective: Callable[[], object]) -> None:
        try:
            collective()
        except Exception as error:  # gloo: a peer's connection closed, or the timeout passed
            raise DistributedError(
                f"rank {self.rank} of {self.world}: {what} failed ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); a rank died or stalled "
                "past the group's timeout"
            ) from error

    def _count(self, kind: str, nbytes: int) -> None:
        calls = self.counts.setdefault(kind, [0, 0])
        calls[0] += 1
        calls[1] += nbytes


def table_digest(cache) -> str:
    """SHA-256 of `cache`'s cell table (`Snapshot`: pos, owners, live, read_len, rows)."""
    snap = cache.snapshot()
    digest = hashlib.sha256()
    for array in (snap.pos, snap.owners, snap.live):
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update(np.array([snap.read_len, snap.rows, snap.capacity], np.int64).tobytes())
    return digest.hexdigest()


def first_difference(mine, theirs, me: str, them: str) -> str:
    """Where two `Snapshot`s (of ranks named `me` and `them`) first differ, in words: a
    cell, the live ids or the sizes."""
    n = min(mine.read_len, theirs.read_len)
    pos = np.flatnonzero(mine.pos[:n] != theirs.pos[:n])
    owners = np.flatnonzero((mine.owners[:n] != theirs.owners[:n]).any(axis=1))
    cells = np.concatenate([pos, owners])
    if len(cells):
        c = int(cells.min())
        return (
            f"cell {c}: pos {mine.pos[c]}, owners {mine.owners_of(c)} on {me}; pos "
            f"{theirs.pos[c]}, owners {theirs.owners_of(c)} on {them}"
        )
    if not np.array_equal(mine.live, theirs.live):
        return f"live ids {mine.live_seqs.tolist()} on {me}, {theirs.live_seqs.tolist()} on {them}"
    return (
        f"read_len {mine.read_len}, rows {mine.rows} on {me}; read_len {theirs.read_len}, "
        f"rows {theirs.rows} on {them}"
    )
