"""SASS as `nvdisasm -c [-g]` prints it, read into instructions, loops and their costs.

`analyse(sass_text)` is the whole reading: every instruction of the kernel (the code before
the first `$__internal_...` subroutine label; the subroutines ptxas appends, such as
`__cuda_sm20_div_s64`, are read but charged to no loop), its loops, and per loop what its
body holds. Counts are static: one instruction in a body is one warp-instruction per
iteration, a nested loop's body is counted once in each loop around it.

- A loop is a backward branch: `BRA` (guarded or not) to a label at or before it; its body
  is the instructions from the label to the branch, both included. Back edges to one label
  make one loop (up to the last of them). A branch to itself (the `BRA` trap ptxas puts
  after the last `EXIT`) is no loop. A loop's *own* instructions are its body less the
  bodies of the loops nested in it: each instruction is its innermost loop's own.
- The hot loop by a figure (global-load bytes for decode, FLOP for prefill) is the
  innermost loop (none nested in it) that holds the most of it per iteration; where no
  innermost loop holds any, the loop whose own instructions hold the most. Ties go to the
  loop with more such instructions, then the longer body, then the earlier one. Its cost
  is its whole body, nested loops counted once (`has_inner_loops` says when there are any).
- A global load is `LDG` (or `LDGSTS`, an asynchronous copy to shared memory); its width is
  read from its modifiers: `.U8`/`.S8` 1 byte, `.U16`/`.S16` 2, none 4 (key "32"), `.64` 8,
  `.128` 16. Cache modifiers (`.E`, `.CONSTANT`, `.LTC128B`, ...) do not change it. A loop's
  load bytes per iteration are sum(width) x 32 lanes.
- A 64-bit integer division or remainder is a call to ptxas's `__cuda_sm20_{div,rem}_{s,u}64`
  (`CALL.REL.NOINC` to a `$__internal_N_$__cuda_sm20_div_s64` label; its 32-bit fast path,
  `I2F.U32.RP` + `MUFU.RCP`, is inlined before the call), or the same routine inlined in the
  kernel (an `I2F.U64.RP`).
- FLOP per warp-instruction, counting only multiply-adds (the work of attention's two
  matrix products; the H200's 67 TFLOP/s float32 peak is FFMA): FFMA 2 x 32 lanes = 64,
  HFMA2 (two halves) 128, HMMA.MNK 2 x M x N x K per warp (HMMA.16816: 4096). FMUL, FADD and
  the rest are instructions with no FLOP. ptxas sets registers to constants with
  `HFMA2.MMA Rd, -RZ, RZ, a, b` (-0 x 0 + the immediates): an HFMA2 with RZ as a factor is
  such a move, neither counted as HFMA2 nor given FLOP.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

WARP = 32  # lanes per warp
LOAD_OPS = ("LDG", "LDGSTS")  # global loads (LDGSTS: global -> shared, asynchronous)
LOAD_WIDTHS = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}  # bytes
COUNTED = ("FFMA", "FMUL", "FADD", "HFMA2", "HMMA", "SHFL", "BAR", "MUFU", "LDS", "STS")
DIV64 = re.compile(r"__cuda_sm\d+_(?:div|rem)_[su]64")

# on a stripped line: no quantifier meets another over the padding nvdisasm writes (three
# adjacent `\s*` took seconds a line on -g output)
_INSTRUCTION = re.compile(r"^/\*([0-9a-fA-F]+)\*/\s+([^;]*?)\s*;?(?:\s*/\*[^*]*\*/)?$")
_GUARD = re.compile(r"^(@!?U?P(?:T|\d+))\s+")
_LABEL = re.compile(r"^([.$\w][\w.$]*):\s*$")
_LINE = re.compile(r'^\s*//##\s*File\s+"[^"]*",\s*line\s+(\d+)')
_TARGET = re.compile(r"`\(([^)]+)\)")
_SECTION = re.compile(r"^\s*//-+\s*\.text\.")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its position, guard predicate, opcode with modifiers."""

    index: int  # position in the kernel's instruction list
    address: int  # byte offset in the function (nvdisasm's /*0a30*/)
    guard: str  # "" or "@P0", "@!UP1", ...
    opcode: str  # with modifiers: "LDG.E.U16.CONSTANT"
    operands: str
    line: int | None  # source line (nvdisasm -g), None without line info

    @property
    def op(self) -> str:
        """The opcode without modifiers: "LDG"."""
        return self.opcode.split(".", 1)[0]

    @property
    def target(self) -> str | None:
        """The label a BRA or CALL goes to, or None."""
        found = _TARGET.search(self.operands)
        return found.group(1) if found else None


def load_width(opcode: str) -> str | None:
    """The width key ("U8", "S8", "U16", "S16", "32", "64", "128") of a global load's opcode,
    or None when it is no global load."""
    parts = opcode.split(".")
    if parts[0] not in LOAD_OPS:
        return None
    sizes = [p for p in parts[1:] if p in LOAD_WIDTHS]
    return sizes[-1] if sizes else "32"


def is_constant_move(ins: Instruction) -> bool:
    """`HFMA2.MMA Rd, -RZ, RZ, a, b`: ptxas's way of setting a register to a constant."""
    factors = [x.strip() for x in ins.operands.split(",")[1:3]]
    return ins.op == "HFMA2" and any(x.lstrip("-|") == "RZ" for x in factors)


def flop(ins: Instruction) -> int:
    """FLOP of one warp-instruction (multiply-adds only; module docstring)."""
    if ins.op == "FFMA":
        return 2 * WARP
    if ins.op == "HFMA2":
        return 0 if is_constant_move(ins) else 4 * WARP
    if ins.op == "HMMA":
        shape = re.match(r"HMMA\.(\d+)", ins.opcode)
        m, n, k = _mma_shape(shape.group(1)) if shape else (0, 0, 0)
        return 2 * m * n * k
    return 0


def _mma_shape(digits: str) -> tuple[int, int, int]:
    """(M, N, K) of an HMMA shape: "16816" -> (16, 8, 16), "1688" -> (16, 8, 8)."""
    m, rest = int(digits[:2]), digits[2:]
    n = int(rest[0])
    return m, n, int(rest[1:])


def is_div64(ins: Instruction) -> bool:
    """A 64-bit integer division or remainder: the call, or the routine inlined."""
    if ins.op == "CALL":
        return bool(DIV64.search(ins.target or ""))
    return ins.opcode.startswith("I2F.U64.RP")


@dataclass
class Program:
    """A kernel's instructions, its labels and where its subroutines start."""

    instructions: list[Instruction]
    labels: dict[str, int]  # label -> index of the instruction after it
    kernel_end: int  # index of the first subroutine instruction (len when none)
    subroutines: dict[str, int] = field(default_factory=dict)  # label -> first index


def parse(sass_text: str) -> Program:
    """Reads the first function of `nvdisasm -c [-g]` output (a cubin of one kernel)."""
    instructions: list[Instruction] = []
    labels: dict[str, int] = {}
    subroutines: dict[str, int] = {}
    line: int | None = None
    sections = 0
    for text in sass_text.splitlines():
        if _SECTION.match(text):
            sections += 1
            if sections > 1:
                break
            continue
        if found := _LINE.match(text):
            line = int(found.group(1))
            continue
        if found := _LABEL.match(text):
            name = found.group(1)
            labels[name] = len(instructions)
            if name.startswith("$"):
                subroutines[name] = len(instructions)
            continue
        if not (found := _INSTRUCTION.match(text.strip())):
            continue
        body = found.group(2)
        guard = ""
        if g := _GUARD.match(body):
            guard, body = g.group(1), body[g.end() :]
        opcode, _, operands = body.partition(" ")
        ins = Instruction(len(instructions), int(found.group(1), 16), guard, opcode,
                          operands.strip(), line)  # fmt: skip
        instructions.append(ins)
    end = min(subroutines.values(), default=len(instructions))
    return Program(instructions, labels, end, subroutines)


@dataclass
class BodyCost:
    """What one loop body (or any span of instructions) holds, per iteration."""

    instructions: int = 0  # warp-instructions
    loads: dict[str, int] = field(default_factory=dict)  # width key -> global loads
    # width key -> loads through the read-only path (`.CONSTANT`: ld.global.nc), which the
    # attention kernels take for K/V rows and nothing else
    readonly_loads: dict[str, int] = field(default_factory=dict)
    load_bytes: int = 0  # sum of widths x 32 lanes: bytes a warp loads per iteration
    flop: int = 0  # per warp per iteration (multiply-adds only)
    div64: int = 0  # 64-bit integer divisions/remainders
    ops: dict[str, int] = field(default_factory=dict)  # COUNTED opcode -> instructions
    lines: dict[int, int] = field(default_factory=dict)  # source line -> instructions

    @classmethod
    def of(cls, instructions: list[Instruction]) -> BodyCost:
        """The cost of `instructions`."""
        loads: Counter[str] = Counter()
        readonly: Counter[str] = Counter()
        ops: Counter[str] = Counter()
        lines: Counter[int] = Counter()
        for ins in instructions:
            width = load_width(ins.opcode)
            if width is not None:
                loads[width] += 1
                readonly[width] += ".CONSTANT" in ins.opcode
            if ins.op in COUNTED and not is_constant_move(ins):
                ops[ins.op] += 1
            if ins.line is not None:
                lines[ins.line] += 1
        return cls(
            instructions=len(instructions),
            loads=dict(loads),
            readonly_loads={w: n for w, n in readonly.items() if n},
            load_bytes=WARP * sum(LOAD_WIDTHS[w] * n for w, n in loads.items()),
            flop=sum(flop(ins) for ins in instructions),
            div64=sum(is_div64(ins) for ins in instructions),
            ops={op: ops[op] for op in COUNTED},
            lines=dict(sorted(lines.items())),
        )


@dataclass
class Loop:
    """A loop of the kernel: instructions[head : tail + 1], the label to the back branch."""

    label: str
    head: int  # index of the first body instruction
    tail: int  # index of the (last) backward branch
    head_address: int
    tail_address: int
    parent: int | None = None  # index in KernelCost.loops of the loop around it
    children: list[int] = field(default_factory=list)
    depth: int = 0  # 0: outermost
    cost: BodyCost = field(default_factory=BodyCost)  # the whole body, nested loops once
    own: BodyCost = field(default_factory=BodyCost)  # the body less the nested loops' bodies

    @property
    def has_inner_loops(self) -> bool:
        """Whether another loop is nested in this one (its body counted once here)."""
        return bool(self.children)

    def contains(self, other: Loop) -> bool:
        """Whether `other` is strictly nested in this loop."""
        same = (self.head, self.tail) == (other.head, other.tail)
        return not same and self.head <= other.head and other.tail <= self.tail


def find_loops(program: Program) -> list[Loop]:
    """The kernel's loops (subroutines aside), ordered by head, with their nesting."""
    tails: dict[str, int] = {}
    for ins in program.instructions[: program.kernel_end]:
        label = ins.target
        if ins.op != "BRA" or label is None or label not in program.labels:
            continue
        head = program.labels[label]
        if head < ins.index:  # head == index: the trap branch to itself
            tails[label] = max(tails.get(label, ins.index), ins.index)
    code = program.instructions
    loops = [
        Loop(label, head, tail, code[head].address, code[tail].address)
        for label, tail in tails.items()
        for head in [program.labels[label]]
    ]
    loops.sort(key=lambda lp: (lp.head, -lp.tail))
    for i, loop in enumerate(loops):
        around = [j for j, other in enumerate(loops) if other.contains(loop)]
        if around:  # the innermost loop around it: the one with the shortest body
            loop.parent = min(around, key=lambda j: loops[j].tail - loops[j].head)
            loops[loop.parent].children.append(i)
        loop.cost = BodyCost.of(code[loop.head : loop.tail + 1])
    for loop in loops:
        nested = {i for c in loop.children for i in range(loops[c].head, loops[c].tail + 1)}
        span = range(loop.head, loop.tail + 1)
        loop.own = BodyCost.of([code[i] for i in span if i not in nested])
        depth, parent = 0, loop.parent
        while parent is not None:
            depth, parent = depth + 1, loops[parent].parent
        loop.depth = depth
    return loops


def hottest(loops: list[Loop], key: str) -> Loop | None:
    """The innermost loop (no loop nested in it) whose instructions hold the most `key`
    ("load_bytes" or "flop") per iteration, or, when no innermost loop holds any, the loop
    whose own instructions hold the most (ties: more loads or multiply-adds, a longer body,
    the earlier); None when no loop holds any. Innermost first: an outer loop's own loads
    (a block's setup per item) run once per many steps of the loop inside it."""

    def rank(lp: Loop) -> tuple:
        own = lp.own
        n = sum(own.loads.values()) if key == "load_bytes" else own.ops["FFMA"]
        n += 0 if key == "load_bytes" else own.ops["HFMA2"] + own.ops["HMMA"]
        is_innermost = not lp.has_inner_loops and getattr(own, key) > 0
        return is_innermost, getattr(own, key), n, lp.cost.instructions, -lp.head

    best = max(loops, key=rank, default=None)
    return best if best is not None and getattr(best.own, key) > 0 else None


@dataclass
class KernelCost:
    """Everything `analyse` reads from a kernel's SASS (counts per warp; bytes; FLOP)."""

    kernel: BodyCost  # the whole kernel body, once (subroutines aside)
    in_loops: BodyCost  # the instructions inside any loop, each once
    loops: list[Loop]
    hot_load_loop: Loop | None  # own instructions with the most global-load bytes
    hot_flop_loop: Loop | None  # own instructions with the most FLOP
    subroutines: list[str]  # labels of ptxas's subroutines: "$__internal_0_$__cuda_sm20_div_s64"

    @property
    def instructions_per_byte(self) -> float | None:
        """Warp-instructions of the hot load loop per byte it loads (None: no loads in loops)."""
        hot = self.hot_load_loop
        return hot.cost.instructions / hot.cost.load_bytes if hot else None

    @property
    def flop_per_instruction(self) -> float | None:
        """FLOP per warp-instruction of the hot FLOP loop (None: no multiply-add in loops)."""
        hot = self.hot_flop_loop
        return hot.cost.flop / hot.cost.instructions if hot else None


def analyse(sass_text: str) -> KernelCost:
    """Reads `nvdisasm -c [-g]` output of one kernel into its `KernelCost`."""
    program = parse(sass_text)
    code = program.instructions[: program.kernel_end]
    loops = find_loops(program)
    looped = sorted({i for lp in loops for i in range(lp.head, lp.tail + 1)})
    return KernelCost(
        kernel=BodyCost.of(code),
        in_loops=BodyCost.of([code[i] for i in looped]),
        loops=loops,
        hot_load_loop=hottest(loops, "load_bytes"),
        hot_flop_loop=hottest(loops, "flop"),
        subroutines=sorted(program.subroutines, key=program.subroutines.get),
    )
