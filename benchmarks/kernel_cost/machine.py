"""The machine the figures are for (an H200, sm_90) in one place, and its occupancy rule.

Sources: the issue rate is /work/shared/NUMBA_NOTES.md ("Reading machine code without a
GPU": 132 SMs x 4 schedulers x ~1.9 GHz); bandwidth and FLOP peak are issue 44's H200
figures; the per-SM limits are compute capability 9.0's in NVIDIA's CUDA C++ Programming
Guide (table "Technical Specifications per Compute Capability") and its occupancy
calculator (register allocation unit, 1 KB of shared memory reserved per block).
"""

from __future__ import annotations

from dataclasses import dataclass

ARCH = "sm_90"  # what ptxas assembles for
ISSUE_RATE = 1.0e12  # warp-instructions/s, whole GPU (NUMBA_NOTES: 132 x 4 x ~1.9e9)
HBM_BANDWIDTH = 4.8e12  # bytes/s, H200 HBM3e (issue 44)
FP32_FMA_PEAK = 67e12  # FLOP/s, H200 float32 FMA on CUDA cores (issue 44)
N_SMS = 132  # multiprocessors of an H200 (NUMBA_NOTES, issue 44)
WARP = 32  # threads per warp
REGISTERS_PER_SM = 65536  # 32-bit registers per SM (CUDA guide, cc 9.0)
REGISTER_UNIT = 256  # registers are given to a warp in units of 256 (occupancy calculator)
MAX_REGISTERS_PER_THREAD = 255  # (CUDA guide, cc 9.0)
MAX_WARPS_PER_SM = 64  # resident warps per SM (CUDA guide, cc 9.0)
MAX_BLOCKS_PER_SM = 32  # resident blocks per SM (CUDA guide, cc 9.0)
MAX_THREADS_PER_BLOCK = 1024  # (CUDA guide)
SHARED_PER_SM = 228 * 1024  # bytes of shared memory per SM, the largest carveout (cc 9.0)
SHARED_RESERVED_PER_BLOCK = 1024  # bytes the system reserves per resident block (cc >= 8.0)
SHARED_MAX_PER_BLOCK = 227 * 1024  # bytes one block may use, dynamic included (cc 9.0)
SHARED_UNIT = 128  # shared memory is given in units of 128 bytes (occupancy calculator)

LIMITS = ("registers", "shared", "warps", "blocks")  # what can bound resident blocks


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks and warps per SM of one kernel at one block size."""

    threads: int  # per block
    registers: int  # per thread
    shared_bytes: int  # per block, static + dynamic
    blocks: int  # resident blocks per SM (0: the block cannot run)
    warps: int  # resident warps per SM
    limited_by: tuple[str, ...]  # the LIMITS that give `blocks` (several when tied)
    by_limit: dict[str, int]  # blocks per SM each limit alone allows

    @property
    def fraction(self) -> float:
        """Resident warps / MAX_WARPS_PER_SM."""
        return self.warps / MAX_WARPS_PER_SM


def round_up(n: int, unit: int) -> int:
    """n rounded up to a multiple of unit."""
    return -(-n // unit) * unit


def occupancy(registers: int, shared_bytes: int, threads: int) -> Occupancy:
    """Resident blocks and warps per SM on sm_90 of a kernel using `registers` per thread
    and `shared_bytes` (static + dynamic) per block, launched with `threads` per block.

    Registers: regs/thread rounded up to 8 (a warp's 32 x that, in units of 256), each warp
    of a block holding them; shared: (bytes rounded up to 128) + 1 KB reserved per block out
    of 228 KB, at most 227 KB per block; at most 64 warps and 32 blocks per SM.
    """
    if not 0 < threads <= MAX_THREADS_PER_BLOCK:
        raise ValueError(f"threads={threads} outside 1..{MAX_THREADS_PER_BLOCK}")
    warps_per_block = -(-threads // WARP)
    regs_per_warp = round_up(max(registers, 1) * WARP, REGISTER_UNIT)
    if registers > MAX_REGISTERS_PER_THREAD:
        by_registers = 0
    else:
        by_registers = REGISTERS_PER_SM // regs_per_warp // warps_per_block
    shared = round_up(shared_bytes, SHARED_UNIT)
    if shared > SHARED_MAX_PER_BLOCK:
        by_shared = 0
    else:
        by_shared = SHARED_PER_SM // (shared + SHARED_RESERVED_PER_BLOCK)
    by_limit = {
        "registers": by_registers,
        "shared": by_shared,
        "warps": MAX_WARPS_PER_SM // warps_per_block,
        "blocks": MAX_BLOCKS_PER_SM,
    }
    blocks = min(by_limit.values())
    limited_by = tuple(name for name in LIMITS if by_limit[name] == blocks)
    return Occupancy(threads, registers, shared_bytes, blocks, blocks * warps_per_block,
                     limited_by, by_limit)  # fmt: skip


def bandwidth_ceiling(instructions_per_byte: float) -> float:
    """Bytes/s a loop of `instructions_per_byte` warp-instructions per loaded byte can move
    at most, at ISSUE_RATE."""
    return ISSUE_RATE / instructions_per_byte


def flop_ceiling(flop_per_instruction: float) -> float:
    """FLOP/s a loop of `flop_per_instruction` FLOP per warp-instruction reaches at most, at
    ISSUE_RATE."""
    return ISSUE_RATE * flop_per_instruction
