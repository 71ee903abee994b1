"""benchmarks.kernel_cost: its SASS reading on hand-written snippets, its occupancy
arithmetic, one real kernel end to end (ptxas and nvdisasm, skipped without them), and the
budgets the kernels' machine code is held to (BUDGETS)."""

import math
import re

import pytest

from benchmarks.kernel_cost import machine, sass
from benchmarks.kernel_cost.compile import (
    compile_kernels,
    kernel_kind,
    pool_dtypes,
)
from benchmarks.kernel_cost.report import figures, measure
from benchmarks.kernel_cost.tools import ToolMissing, find_tool, parse_ptxas

# {kernel name pattern (re.search over registry names): {metric: bound}}: every signature of
# every kernel a pattern matches must keep every metric within its bound. Metrics are keys
# of `report.figures`; UPPER ones are maxima, LOWER ones minima. Issue 44's decode budget
# for float16 and bfloat16 K/V (float32 pools load 32 bytes a row part: the same loop, half
# the instructions per byte): warp-instructions per K/V byte served in the hot loop, K/V
# rows read only by 128-bit loads there (the read-only path; the cell table's 32-bit loads
# are not K/V), no 64-bit division in any loop, no spills, 16 resident warps per
# multiprocessor (tests/cache/test_ptx.py holds every kernel to no spills).
DECODE_BUDGET = {"instructions_per_byte": 0.35, "hot_readonly_loads_below_128": 0,
                 "div64_in_loops": 0, "spill_bytes": 0, "warps_per_sm": 16}  # fmt: skip
DECODE = r"attention\.decode\.attend_(gathered|masked)_decode(_bf16)?_d(64|128|256)_h\d+$"
# the quantized decode kernels at head_dim 128, GQA 4: hot-loop instructions per token at
# most these multiples of the float16 kernel's of the same mode (both loops step the same
# tokens, 2 cells per row group). Measured (gathered, masked; float16 304, 331): q8_0 352,
# 377 (1.16x, 1.14x); q4_0 385, 411 (1.27x, 1.24x); fp8_e4m3 393, 418 (1.29x, 1.26x).
# Issue 44's 0.6x / 0.4x cannot be met in float32 on CUDA cores (docs/contract.md §5.2).
QUANTIZED_DECODE = (
    r"attention\.decode\.attend_(gathered|masked)_decode_(q8_0|q4_0|fp8_e4m3)_d128_h4$"
)
QUANTIZED_RATIO = {"q8_0": 1.2, "q4_0": 1.3, "fp8_e4m3": 1.32}
BUDGETS: dict[str, dict[str, float]] = {
    DECODE: DECODE_BUDGET,
    QUANTIZED_DECODE: {"div64_in_loops": 0, "spill_bytes": 0, "warps_per_sm": 16},
    r"attention\.merge\.merge_splits": {"div64_in_loops": 0, "spill_bytes": 0},
    # issue 44's prefill budget: >= 24 FLOP per warp-instruction in the hot loop (the p.V
    # loop of the register tiles), no spills, no 64-bit division in a loop, 12 warps per SM
    r"attention\.prefill\.attend_(gathered|masked)_prefill_d128$": {
        "flop_per_instruction": 24,
        "spill_bytes": 0,
        "div64_in_loops": 0,
        "warps_per_sm": 12,
    },
}
UPPER = {"instructions_per_byte", "hot_loads_below_128", "hot_readonly_loads_below_128",
         "div64_in_loops", "div64", "spill_bytes", "registers", "shared_bytes",
         "instructions"}  # fmt: skip
LOWER = {"warps_per_sm", "blocks_per_sm", "flop_per_instruction", "bandwidth_fraction",
         "flop_fraction"}  # fmt: skip

HEADER = """\
//--------------------- .text.kernel --------------------------
kernel:
.text.kernel:
"""

LOOP_128 = """\
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/x/kernel.py", line 10
        /*0010*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*0020*/                   LDG.E.128.CONSTANT R8, desc[UR4][R2.64+0x10] ;
	//## File "/x/kernel.py", line 11
        /*0030*/                   FFMA R12, R4, R5, R12 ;
        /*0040*/                   FFMA R12, R6, R7, R12 ;
        /*0050*/                   HFMA2.MMA R13, -RZ, RZ, 0, 0 ;
        /*0060*/                   IADD3 R2, P0, R2, 0x20, RZ ;
        /*0070*/                   ISETP.NE.AND P1, PT, R2, R3, PT ;
        /*0080*/               @P1 BRA `(.L_x_1) ;
        /*0090*/                   STG.E desc[UR4][R14.64], R12 ;
        /*00a0*/                   EXIT ;
.L_x_2:
        /*00b0*/                   BRA `(.L_x_2);
        /*00c0*/                   NOP;
"""

NESTED = """\
        /*0000*/                   MOV R1, RZ ;
.L_x_0:
        /*0010*/                   LDG.E.U16 R2, desc[UR4][R10.64] ;
        /*0020*/                   LDG.E.S8 R3, desc[UR4][R10.64] ;
.L_x_1:
        /*0030*/                   LDG.E R4, desc[UR4][R12.64] ;
        /*0040*/                   LDG.E.64 R6, desc[UR4][R12.64+0x8] ;
        /*0050*/                   FFMA R8, R4, R6, R8 ;
        /*0060*/              @!P0 BRA `(.L_x_1) ;
        /*0070*/                   SHFL.BFLY PT, R9, R8, 0x10, 0x1f ;
.L_x_3:
        /*0080*/                   LDS R5, [R1] ;
        /*0090*/                   FFMA R8, R5, R5, R8 ;
        /*00a0*/                   FFMA R8, R5, R5, R8 ;
        /*00b0*/                   FFMA R8, R5, R5, R8 ;
        /*00c0*/               @P2 BRA `(.L_x_3) ;
        /*00d0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00e0*/               @P1 BRA `(.L_x_0) ;
        /*00f0*/                   EXIT ;
"""

DIVISION = """\
        /*0000*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64) ;
.L_x_5:
        /*0010*/                   LDG.E.U8 R2, desc[UR4][R10.64] ;
        /*0020*/              @!P0 BRA `(.L_x_6) ;
        /*0030*/                   MOV R6, 0x50 ;
        /*0040*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64) ;
        /*0050*/                   BRA `(.L_x_7) ;
.L_x_6:
        /*0060*/                   I2F.U32.RP R4, R0 ;
        /*0070*/                   MUFU.RCP R4, R4 ;
.L_x_7:
        /*0080*/              @P1 BRA `(.L_x_5) ;
        /*0090*/                   EXIT ;
$__internal_0_$__cuda_sm20_div_s64:
        /*00a0*/                   I2F.U64.RP R49, R32 ;
.L_x_8:
        /*00b0*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*00c0*/               @P0 BRA `(.L_x_8) ;
        /*00d0*/                   RET.REL.NODEC R32 `(kernel) ;
"""


def analyse(body: str) -> sass.KernelCost:
    """The analysis of a snippet of instructions under nvdisasm's function header."""
    return sass.analyse(HEADER + body)


def test_a_loop_of_wide_loads_and_fmas():
    cost = analyse(LOOP_128)
    assert cost.kernel.instructions == 13  # the trap branch and the NOP after EXIT included
    (loop,) = cost.loops  # the trap `BRA` to itself is no loop
    assert (loop.label, loop.head_address, loop.tail_address) == (".L_x_1", 0x10, 0x80)
    assert loop.cost.instructions == 8 and not loop.has_inner_loops
    assert loop.cost.loads == {"128": 2}
    assert loop.cost.load_bytes == 2 * 16 * 32
    assert loop.cost.ops["FFMA"] == 2 and loop.cost.ops["HFMA2"] == 0  # the HFMA2 is a move
    assert loop.cost.flop == 2 * 64
    assert loop.cost.lines == {10: 2, 11: 6}
    assert cost.hot_load_loop is loop and cost.hot_flop_loop is loop
    assert cost.instructions_per_byte == 8 / 1024
    assert cost.flop_per_instruction == 128 / 8
    assert cost.in_loops.div64 == 0 and cost.subroutines == []


def test_nested_loops_and_their_own_instructions():
    cost = analyse(NESTED)
    outer, inner, second = cost.loops
    assert [lp.label for lp in cost.loops] == [".L_x_0", ".L_x_1", ".L_x_3"]
    assert (outer.depth, inner.depth, second.depth) == (0, 1, 1)
    assert inner.parent == second.parent == 0 and outer.children == [1, 2]
    assert outer.has_inner_loops and not inner.has_inner_loops
    assert outer.cost.instructions == 14  # both inner bodies counted once
    assert outer.own.instructions == 14 - 4 - 5
    assert outer.cost.loads == {"U16": 1, "S8": 1, "32": 1, "64": 1}
    assert outer.own.load_bytes == (2 + 1) * 32
    assert inner.cost.load_bytes == (4 + 8) * 32
    assert cost.hot_load_loop is inner  # the most load bytes of its own
    assert cost.hot_flop_loop is second  # 3 FFMA against the inner loop's 1
    assert cost.flop_per_instruction == 3 * 64 / 5
    assert outer.cost.ops["SHFL"] == 1 and outer.cost.ops["BAR"] == 1
    assert outer.cost.ops["LDS"] == 1 and outer.cost.ops["FFMA"] == 4
    assert cost.in_loops.loads == cost.kernel.loads


def test_an_innermost_loop_is_hot_even_when_an_outer_one_loads_more_of_its_own():
    # a block's setup per item (the outer loop's own loads) runs once per many inner steps
    text = NESTED.replace("LDG.E.U16 R2", "LDG.E.128 R2").replace("LDG.E.S8", "LDG.E.128")
    cost = analyse(text)
    outer, inner, _ = cost.loops
    assert outer.own.load_bytes > inner.own.load_bytes
    assert cost.hot_load_loop is inner and not inner.has_inner_loops
    assert cost.instructions_per_byte == 4 / ((4 + 8) * 32)


def test_the_outer_loop_is_hot_when_no_innermost_loop_loads():
    text = NESTED.replace("LDG.E R4", "MOV R4, RZ").replace("LDG.E.64 R6", "MOV R6, RZ")
    cost = analyse(text)
    hot = cost.hot_load_loop
    assert hot is cost.loops[0] and hot.has_inner_loops
    assert hot.cost.load_bytes == (2 + 1) * 32
    assert cost.instructions_per_byte == 14 / ((2 + 1) * 32)


def test_a_64_bit_division_in_a_loop():
    cost = analyse(DIVISION)
    assert cost.subroutines == ["$__internal_0_$__cuda_sm20_div_s64"]
    assert cost.kernel.instructions == 10  # the subroutine is not the kernel's
    assert cost.kernel.div64 == 2 and cost.in_loops.div64 == 1
    (loop,) = cost.loops  # the subroutine's loop is charged to nothing
    assert loop.cost.div64 == 1 and loop.cost.ops["MUFU"] == 1
    assert loop.cost.loads == {"U8": 1} and cost.in_loops.loads == {"U8": 1}
    inlined = DIVISION.replace("MUFU.RCP R4, R4", "I2F.U64.RP R4, R0")
    assert analyse(inlined).in_loops.div64 == 2


@pytest.mark.parametrize(
    "opcode, width",
    [("LDG.E.U8", "U8"), ("LDG.E.S16.CONSTANT", "S16"), ("LDG.E", "32"), ("LDG.E.64", "64"),
     ("LDG.E.LTC128B.U16", "U16"), ("LDG.E.128.CONSTANT", "128"), ("LDGSTS.E.BYPASS.128", "128"),
     ("LDS.128", None), ("STG.E.128", None)],
)  # fmt: skip
def test_load_widths(opcode, width):
    assert sass.load_width(opcode) == width


def test_flop_of_tensor_core_and_half_instructions():
    def ins(text: str) -> sass.Instruction:
        opcode, _, operands = text.partition(" ")
        return sass.Instruction(0, 0, "", opcode, operands, None)

    assert sass.flop(ins("HMMA.16816.F32 R4, R8, R12, R4")) == 2 * 16 * 8 * 16
    assert sass.flop(ins("HMMA.1688.F32 R4, R8, R12, R4")) == 2 * 16 * 8 * 8
    assert sass.flop(ins("HFMA2 R4, R5, R6, R7")) == 128
    assert sass.flop(ins("HFMA2.MMA R4, -RZ, RZ, 1.5, 0")) == 0
    assert sass.flop(ins("FMUL R4, R5, R6")) == 0


@pytest.mark.parametrize(
    "registers, shared, threads, warps, limited_by",
    [
        (128, 0, 128, 16, ("registers",)),  # 128 x 32 = 4096 registers a warp: 16 warps
        (127, 42416, 128, 16, ("registers",)),  # issue 44's decode: rounded up to 128
        (64, 0, 128, 32, ("registers",)),
        (32, 0, 256, 64, ("registers", "warps")),
        (255, 0, 256, 8, ("registers",)),  # 8192 a warp: 8 warps, one block
        (40, 40 * 1024, 128, 20, ("shared",)),  # 233472 // (40960 + 1024) = 5 blocks
        (32, 48 * 1024, 128, 16, ("shared",)),  # 233472 // 50176 = 4 blocks
        (32, 227 * 1024, 32, 1, ("shared",)),  # the most one block may have
        (16, 0, 32, 32, ("blocks",)),  # 32 blocks of one warp
        (256, 0, 32, 0, ("registers",)),  # more than 255 registers: cannot run
        (32, 227 * 1024 + 1, 32, 0, ("shared",)),
    ],
)
def test_occupancy(registers, shared, threads, warps, limited_by):
    occ = machine.occupancy(registers, shared, threads)
    assert occ.warps == warps
    assert occ.limited_by == limited_by
    assert occ.blocks == warps // math.ceil(threads / 32)


def test_occupancy_refuses_impossible_blocks():
    with pytest.raises(ValueError):
        machine.occupancy(32, 0, 1025)


def test_ptxas_report_parsing():
    report = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
        "ptxas info    : Function properties for k\n"
        "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 127 registers, used 1 barriers, 42416 bytes smem, 400 bytes cmem[0]\n"
    )
    info = parse_ptxas(report)
    assert (info.registers, info.shared_bytes, info.barriers) == (127, 42416, 1)
    assert (info.spill_store_bytes, info.spill_load_bytes, info.spill_bytes) == (8, 12, 20)
    assert info.stack_bytes == 16
    assert parse_ptxas("ptxas info    : Used 8 registers\n").shared_bytes == 0
    with pytest.raises(ValueError):
        parse_ptxas("ptxas fatal   : nothing")


def test_kinds_and_pools_from_names_and_signatures():
    decode = "numbakv.cache.kernels.attention.decode.attend_gathered_decode"
    sig = "void(float32[:, :, ::1], float16[:, :, ::1], float16[:, :, ::1], int32[:, ::1])"
    assert kernel_kind(decode) == "decode" and pool_dtypes(decode, sig) == "f16/f16"
    assert kernel_kind("x.prefill.attend_masked_prefill_q8_0") == "prefill"
    assert kernel_kind("numbakv.cache.kernels.attention.merge.merge_splits") == "other"
    scatter = "void(float32[:, ::1], float32[:, ::1], uint8[:, :, ::1], uint8[:, :, ::1])"
    assert pool_dtypes("p.scatter_kv_q8_0", scatter) == "f32->u8/u8"
    assert pool_dtypes("p.prepare_tokens", "void(int32[:, ::1], uint64[::1], int32[::1])") == (
        "i32,u64"
    )


def tools_or_skip() -> None:
    try:
        find_tool("ptxas")
        find_tool("nvdisasm")
    except ToolMissing as e:
        pytest.skip(str(e))


def measured(patterns: list[str], tmp_path) -> list[dict]:
    compiled = compile_kernels(patterns, tmp_path, jobs=2)
    return [figures(m) for m in measure(compiled.kernels, jobs=2)]


def test_a_real_kernel_end_to_end(tmp_path):
    tools_or_skip()
    rows = measured([r"\.placement\.prepare_tokens$", r"\.masks\.write_masks$"], tmp_path)
    assert {f["name"].rsplit(".", 1)[1] for f in rows} == {"prepare_tokens", "write_masks"}
    for f in rows:
        assert f["error"] is None, f["error"]
        assert f["kind"] == "other" and f["threads"] == 256
        assert 0 < f["registers"] <= 255 and f["spill_bytes"] == 0
        occ = machine.occupancy(f["registers"], f["shared_bytes"], f["threads"])
        assert f["warps_per_sm"] == occ.warps == f["blocks_per_sm"] * f["threads"] // 32
        assert 0 < f["warps_per_sm"] <= 64
        hot = f["hot_loop"]
        assert 0 < hot["instructions"] <= f["instructions"]
        width = sass.LOAD_WIDTHS
        assert hot["load_bytes"] == 32 * sum(width[w] * n for w, n in hot["loads"].items())
        assert all(n <= f["loop_loads"][w] for w, n in hot["loads"].items())
        assert all(n <= f["loads"][w] for w, n in f["loop_loads"].items())
        assert f["instructions_per_byte"] == hot["instructions"] / hot["load_bytes"]
        ceiling = f["bandwidth_ceiling"] * f["instructions_per_byte"]
        assert ceiling == pytest.approx(machine.ISSUE_RATE)
        assert f["div64_in_loops"] <= f["div64"]
        outermost = [lp["instructions"] for lp in f["all_loops"] if lp["depth"] == 0]
        assert sum(outermost) <= f["instructions"]


@pytest.fixture(scope="module")
def budget_rows(tmp_path_factory) -> list[dict]:
    """The figures of every kernel a BUDGETS pattern matches, compiled once."""
    tools_or_skip()
    return measured(list(BUDGETS), tmp_path_factory.mktemp("budgets"))


@pytest.mark.parametrize("pattern", sorted(BUDGETS))
def test_budget(pattern, budget_rows):
    rows = [f for f in budget_rows if re.search(pattern, f["name"])]
    assert rows, f"no registered kernel matches {pattern!r}"
    over = []
    for metric, bound in BUDGETS[pattern].items():
        assert metric in UPPER | LOWER, f"unknown metric {metric!r} (UPPER or LOWER?)"
        for f in rows:
            value = f.get(metric)
            ok = value is not None and (value <= bound if metric in UPPER else value >= bound)
            if not ok:
                over.append(f"{f['name']} [{f['pools']}] {metric} = {value}, bound {bound}")
    assert not over, "\n".join(over)


@pytest.mark.parametrize("mode", ["gathered", "masked"])
def test_quantized_decode_against_float16(mode, budget_rows):
    def hot(kind: str, pools: str) -> int:
        name = f"attend_{mode}_decode{kind}_d128_h4"
        (row,) = [f for f in budget_rows if f["name"].endswith(name) and f["pools"] == pools]
        return row["hot_loop"]["instructions"]

    base = hot("", "f16/f16")
    ratios = {kind: hot(f"_{kind}", "u8/u8") / base for kind in QUANTIZED_RATIO}
    over = {k: round(r, 3) for k, r in ratios.items() if r > QUANTIZED_RATIO[k]}
    assert not over, f"hot-loop instructions over float16's ({base}): {over}"
