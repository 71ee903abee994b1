"""One command for a GPU: numbakv's device checks and figures in one table, in <= 8 minutes.

    python -m benchmarks.gpu_check          # on a GPU (NUMBAKV_DEVICE=gpu)
    python -m benchmarks.gpu_check --sim    # tiny shapes on numba's CUDA simulator, seconds

It installs nothing. It prints the versions it finds first (numba, numba-cuda, torch and
CuPy may differ from the pins), and a part whose dependency is missing says so and is
skipped. One part that fails prints its error and the others still run; the exit code is 1
when any part failed. The parts, in the order they run:

    copy          a device-to-device copy of 1 GiB on one stream, CUDA events: the bandwidth
                  the attention is held to (bytes read + bytes written per second)
    attention     decode attention, one token per sequence, at batch 64 x 4k cells in every
                  storage format (float16, bfloat16, float32, q8_0, q4_0, fp8_e4m3) and
                  16 x 32k in float16 (while 300 s of the run are left), GQA 8 and 4 (8 KV
                  heads, head_dim 128), gathered (float16 masked too): the median time of a
                  launch (CUDA events on the step's stream), the K/V bytes the tokens see in
                  that format (numbakv.core.formats.head_bytes, scales included) / that time, and
                  that / the copy's bandwidth; then one prefill step of 8 sequences x 2k new
                  tokens (GQA 4, float16, gathered): its TFLOP/s (4 x head_dim x n_heads x
                  the cells each token sees, summed, / time). Beside each: torch's
                  scaled_dot_product_attention on the same data where torch has CUDA
                  (float16 and bfloat16 K/V; causal for the prefill), its time and GB/s or
                  TFLOP/s; and "model", benchmarks.kernel_cost's ceiling of the kernel the
                  plan picked (named in the part's output), compiled, assembled and read
                  from its sm_90 machine code in the same run: TB/s (TF/s for the prefill),
                  "n/a" with the reason under the table without ptxas/nvdisasm, "sim" on the
                  simulator. Every output checked against numbakv.reference's solo oracle
                  over the K/V as the format stores them, within
                  numbakv.core.config.TOLERANCE["float32"] (the kernels compute in float32)
    decode step   one decode step through 32 layers with device inputs and no model
                  (declare_step, prepare_step, then write + attend per layer): the host's
                  wall clock until the last launch returns, CUDA events over the step, and
                  the wall clock to a synchronize
    inputs        q, k, v as views of one fused torch bfloat16 (and float16) QKV tensor,
                  read through DLPack, and a bfloat16 `out=`: equal to the float32 copies'
                  output rounded to that dtype, written into the caller's tensor
    saved         one sequence's K/V through every layer (32 x 4k positions, float16)
                  saved to the host (`seq_save`) and loaded back into the holes another
                  left (`seq_load`): µs to a synchronize, the state's bytes / that time, and
                  that / the copy's bandwidth; the loaded sequence must save back equal
    model graphs  decode steps of a 32-layer device-resident model (`DeviceModel`) at batch
                  1, 16 and 64: µs per step (declare, prepare, stage, launches, logits
                  back) eager and replayed from one captured step (a CUDA graph), whose
                  logits must equal the eager ones bit for bit
    launch budget python -m benchmarks.launch_budget --check, on the simulator
    device tests  pytest tests/cache tests/contract with NUMBAKV_DEVICE=gpu, in the time left

--sim runs the same code with tiny shapes on the simulator, without pytest and torch; the
test suite runs it (tests/test_gpu_check.py), so that this command cannot rot. Each part is
a module of this package (`versions`, `attention`: copy and decode attention, with
`prefill`: the prefill step, `decode`, `inputs`, `saved`, `model`, `commands`: launch budget
and device tests); what they share is in `run`, the filled caches in `fill`, torch beside
numbakv in `torch_sdpa`, kernel_cost's estimates in `estimate`, the command in `__main__`.
"""
