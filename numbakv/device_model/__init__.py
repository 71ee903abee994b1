"""numbakv.device_model: `numbakv.serve.model.Model`'s forward on the device, `numbakv.DeviceModel`.

    dm = DeviceModel(model, cache.config)
    logits = dm.forward(cache, step, tokens, logits_at)  # [len(logits_at), vocab_size] float32

The same weights and the same float32 math as the NumPy model, with the hidden state on the
device from the embedding to the LM head and only the logits of the tokens `logits_at`
copied back (`docs/contract.md §9`). The design:

- `tiles`: the one matmul scheme, a tile of activation rows in shared memory, each weight
  read once per tile, with an RMSNorm (and token gather) fused into the load, and its one
  tile loop (`make_tile_loop`);
- `kernels`: five kernels on it, registered for PTX (`numbakv.cache.kernels.kernel`) and
  launched through the project's one launcher (`numbakv.cache.kernels.launch.launch`), so
  that a recorder can capture a forward; every per-step value (tokens, logits_at,
  positions) is read from a device buffer, so recorded launches serve any later step of
  their width (`docs/contract.md §8.2`);
- `weights`: the weights and the rotary table uploaded once;
- `model`: `DeviceModel`, whose `stage` / `run` / `logits` split a forward into the
  upload, the capturable launches and the copy back.
"""
