"""Runs a function on every rank of a fresh gloo group of spawned processes, as torchrun
would start them (one BLAS thread each): `on_ranks(target, *args)` -> each rank's result,
by rank. A rank's exception comes back as its (type name, message); a rank that ends
without a result (it was killed) as None."""

import contextlib
import multiprocessing
import os
import queue
import sys
import tempfile
import time
import traceback
from datetime import timedelta

NUMBAKV_DEVICE = os.environ.get("NUMBAKV_DEVICE", "sim")
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def on_ranks(target, *args, world: int = 2, timeout: float = 20.0, limit: float = 180.0):
    """[rank 0's result, rank 1's, ...] of `target(group, *args)` (`group` a numbakv
    `Group` of `world` ranks whose collectives time out after `timeout` seconds); the
    whole run is cut off after `limit` seconds, and the ranks still running 2 seconds
    after one raised are killed."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = f"file://{folder}/store"
        ranks = [
            context.Process(target=_rank, args=(target, args, r, world, store, timeout, results))
            for r in range(world)
        ]
        threads = {name: os.environ.get(name) for name in ONE_THREAD}
        os.environ.update(dict.fromkeys(ONE_THREAD, "1"))  # as torchrun starts ranks
        try:
            for process in ranks:
                process.start()
        finally:
            for name, value in threads.items():
                if value is None:
                    os.environ.pop(name)
                else:
                    os.environ[name] = value
        out: list = [None] * world
        deadline, waiting = time.monotonic() + limit, set(range(world))
        while waiting and time.monotonic() < deadline:
            try:
                rank, value = results.get(timeout=0.1)
            except queue.Empty:
                waiting -= {r for r in waiting if ranks[r].exitcode is not None}  # killed
                continue
            out[rank] = value
            waiting.discard(rank)
            if isinstance(value, tuple) and value and str(value[0]).endswith("Error"):
                deadline = min(deadline, time.monotonic() + 2)
        for process in ranks:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
    return out


def _rank(target, args, rank, world, store, timeout, results) -> None:
    os.environ["NUMBAKV_DEVICE"] = NUMBAKV_DEVICE
    for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world),
                        ("LOCAL_WORLD_SIZE", world)):  # fmt: skip
        os.environ[name] = str(value)  # torchrun's, which transformers' tp_plan reads
    sys.setrecursionlimit(10_000)
    import torch.distributed as dist

    from numbakv.distributed.group import Group

    dist.init_process_group(
        "gloo", init_method=store, rank=rank, world_size=world,
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip
    # every rank's connections made before any runs `target`: a rank that dies at once
    # (a dead peer's test) must not leave another still connecting, failing in its init
    dist.barrier()
    try:
        value = target(Group(), *args)
    except BaseException as error:
        value = (type(error).__name__, f"{error}\n{traceback.format_exc()}")
    results.put((rank, value))
    with contextlib.suppress(Exception):  # the group may be broken: a rank died
        dist.destroy_process_group()
