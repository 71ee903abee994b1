"""numbakv.core: the contract's shared types and checks, which both caches, the serving stack
and the tools build on (docs/contract.md §7: the only code the implementations share). No
numba, no torch; no module here imports a wing. From the bottom up:

    errors     the error classes of docs/contract.md §6
    values     checks of plain values: integers, reals, token ids, shapes
    formats    the storage formats of K and V and how a config resolves them (§4.1)
    config     `CacheConfig`
    calls      checks of the caches' verbs and steps against a config and a table
    arrays     adopting a caller's arrays: NumPy, torch, DLPack, `__cuda_array_interface__`,
               and results in the caller's kind (§5, §5.1)
    snapshot   `Snapshot`, a table's state read back
    observe    the observer hook both caches carry (§7.1)
    paths      checks of file paths
    npz        reading an untrusted `.npz` without trusting it
    seq_state  `SeqState`: a sequence's K/V saved from a cache and loaded into one (§13)
    seq_file   its file
"""
