"""numbakv.serve: a small serving stack over any cell cache, in NumPy and Python (no numba).

model      a Llama-style decoder whose attention runs through `cache.write`/`cache.attend`
models     what the executor needs of any model (`ServedModel`; `Model` and `DeviceModel`
           are two, `numbakv.integrations.transformers.TransformersModel` a third)
tokenizer  the byte tokenizer
sampling   greedy, temperature, top-k, top-p; one draw per sampled token
plan       a run of tokens cut into forwards of at most max_width
scheduler  which queued tokens go into the next batch (decodes first)
executor   sessions over one cache and one model; batches in, logits and tokens out
protocol   what the engine needs of an executor (`Executor` and `Lockstep` both are one)
engine     continuous batching of generation requests
requests   what the engine keeps and returns per request; the checks of a submission
faults     the one place an observer's error is met (`Observed`, `completes`), and what
           went wrong in an engine step
lockstep   two executors driven as one, every result checked against the second
prefix     `PrefixCache`: prompts that share a prefix share its cells (over `radix`, the tree;
           `targets`, the verbs it asks of a cache or an executor)
host_tier  what the prefix cache gives back, kept in host memory and reloaded on a hit
saved      sessions saved and loaded (`SavedSessions`, the executor's)
open_sessions  the executor's open sessions: their sampling and generators
conversations  a finished conversation to a file and into a prefix cache (the engine's)
ledger     the engine's requests by id, and each batch's input
memory     where the engine's sessions and cells come from: hits, holders, eviction
admission  which requests hold sessions: placed by memory, batches fitted, preemption
kv_events  the prefix cache's blocks published as vLLM's KV events (pyzmq, msgspec)
"""
