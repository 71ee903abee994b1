"""numbakv.distributed: serving beyond one device on torch.distributed (docs/contract.md
§15): tensor parallelism over a pool sharded by KV heads.

group            `init` (torchrun's environment, gloo), `Group`: counted collectives, a
                 pool's capacity agreed (MIN), `DistributedError` for a rank that died
tensor_parallel  `shard_model`, `TensorParallel` (rank 0 schedules and broadcasts each
                 call), `serve` (the other ranks apply them), digests of the tables

Needs torch (the `distributed` extra); KV events are `numbakv.serve.kv_events`.
"""
