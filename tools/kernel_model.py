#!/usr/bin/env python3
"""A performance model of the CUDA codec kernels on an H100, read from the compiled binary.

No GPU is needed. Each kernel source (codecs/cuda/*.cu) is compiled for sm_90 with the build's
nvcc flags; nvdisasm gives the SASS (with line info, and the control bits of every instruction)
and ptxas -v the registers and shared memory. From these, per kernel:

  - the loops (natural loops of the control-flow graph) and, for each, the instructions one
    iteration issues on the fast path (by execution pipe; how many are 64-bit integer halves,
    reciprocal sequences of divisions, conversions; call-outs to slow paths left out), its
    global loads and stores by width (LDG.E.128 and the like apart) and its unrolling;
  - the independent global loads in flight per thread: the loads issued before an instruction
    waits on their scoreboard (the wait mask of the control bits), walked over two iterations;
  - occupancy: resident warps per SM from registers, shared memory and the block size.

How many times a loop runs is data, not code: work() gives each kernel's launch (block size,
grid) and the trip count of each loop, from the kernel's source, and names each loop by a line
of that source (matched through the SASS line info).

Per launch, three bounds (seconds):
  dram     the bytes the emulator's traffic table (codecs/cuda/traffic.tsv) says DRAM moves, at
           the bandwidth a device-to-device copy achieves (the one calibrated constant);
  issue    the warp instructions over the SMs' issue rate, each pipe at its own rate;
  latency  Little's law: a warp waits a memory latency at each stall on its loads (a DRAM
           latency for the share of bytes DRAM supplies, an L1 hit for the rest), plus its
           instructions' fixed stall cycles, and only the resident warps wait at once.
The bound is the largest; the prediction adds the exposed memory latency to the larger of the
issue time and the stall chains (warps started together on the same code wait together), up
to the DRAM roofline, plus a launch floor. An encode or decode is the sequence of operations
actpack.encode / actpack.decode run on the device (the traffic table's kernels on the
synchronous path, with its memsets and status copies); its time is their sum, and its
fraction of a copy is the predicted time of a device-to-device copy of the input (one launch,
two DRAM bytes per input byte, the same model) over it.

  python3 tools/kernel_model.py             # HEAD's kernels: the model, printed
  python3 tools/kernel_model.py --update    # rewrite codecs/cuda/model.tsv (HEAD) and
                                            # codecs/cuda/model_2026-11-27.tsv (the kernels the
                                            # H100 measured, from git, against the measurements)
  python3 tools/kernel_model.py --measured  # print the latter only
  python3 tools/kernel_model.py --check     # fail when a predicted fraction of HEAD's kernels
                                            # fell below model.tsv's by more than TOLERANCE
  python3 tools/kernel_model.py --loops FILE.cu [--include DIR]   # any kernel's loops, JSON

The method, the constants and their sources, the calibration and the limits are in
docs/kernel_model.md.
"""
import argparse
import concurrent.futures
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = "/usr/local/cuda/bin/nvcc"
TABLE = "codecs/cuda/model.tsv"
MEASURED_TABLE = "codecs/cuda/model_2026-11-27.tsv"
TRAFFIC = "codecs/cuda/traffic.tsv"
MEASURED_COMMIT = "2094b96"  # the tree benchmarks/results/gpu_h100_2026-11-27 was measured at
BENCHMARK = "benchmarks/results/gpu_h100_2026-11-27/benchmark.txt"
TOLERANCE = 0.02  # --check: a fraction may fall this much (absolute) before the check fails

# ---- the H100 SXM5 (80 GB HBM3) ----
# NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs on the SXM5 part; per SM
# four sub-partitions, each with a warp scheduler dispatching one warp instruction per clock;
# 64 resident warps, 32 resident blocks, 65,536 32-bit registers, 228 KB of shared memory
# (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability", 9.0; 1 KB of
# it reserved per block; registers allocated per warp in units of 256).
SMS = 132
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
ISSUE_PER_SM = 4  # warp instructions per clock
# The clock: cudaDeviceProp::clockRate of an "NVIDIA H100 80GB HBM3" is 1,980,000 kHz (the
# SXM5's maximum boost, NVIDIA H100 datasheet).
CLOCK_HZ = 1.98e9
# HBM3 peak: 3.35 TB/s (NVIDIA H100 datasheet, SXM5).
DRAM_PEAK = 3.35e12
# The one calibrated constant: the fraction of the peak a device-to-device copy achieves, from
# the copy measured beside the codecs (benchmark.txt: 1,326 GB/s of input at 256 MiB, i.e.
# 2 x 1,326 GB/s of DRAM traffic). Every DRAM bound, the copy's own included, runs at it.
DRAM_FRACTION = 2 * 1326e9 / DRAM_PEAK
# Load latencies on an H100 SXM, pointer-chase microbenchmark: main memory 700 cycles, L1 hit
# 40 cycles (markdewing/AI_kernels, latency/README.md; docs/kernel_model.md says why this source,
# and how the calibration moves with the DRAM latency).
DRAM_LATENCY_CYCLES = 700
DRAM_LATENCY_S = DRAM_LATENCY_CYCLES / CLOCK_HZ
L1_LATENCY_CYCLES = 40
L1_LATENCY_S = L1_LATENCY_CYCLES / CLOCK_HZ
# What one launch, memset or small copy costs on the device at least (the floor a tiny kernel
# shows in the profiler; the same 2 us traffic_report.cc and gpu_benchmark.py use). Not
# calibrated: it matters only at small sizes.
LAUNCH_S = 2e-6
# Lanes per clock per SM of each pipe (CUDA C++ Programming Guide, "Arithmetic Instructions",
# compute capability 9.0: 128 FP32 add/mul/fma; 64 32-bit integer add, multiply-add, shift,
# compare, logic; 16 conversions and special functions; 64 FP64; 32 warp shuffles; the
# whitepaper's 32 load/store units per SM).
PIPE_LANES = {"fp32": 128, "alu": 64, "imad": 64, "xu": 16, "fp64": 64, "shfl": 32, "lsu": 32}

# ---- building ----


def nvcc_flags(root):
    """The build's nvcc flags (third_party/actpack.bzl), for sm_90 alone."""
    with open(os.path.join(root, "third_party", "actpack.bzl")) as f:
        text = f.read()
    block = re.search(r"NVCC_FLAGS = \" \"\.join\(\[(.*?)\]\)", text, re.S).group(1)
    flags = [f for f in re.findall(r'"([^"]+)"', block) if not f.startswith("-gencode")]
    return flags + ["-gencode=arch=compute_90,code=sm_90", "-lineinfo"]


def find_tool(name):
    """nvdisasm from the CUDA toolkit, PATH, or the nvidia-cuda-nvdisasm wheel."""
    for candidate in (os.path.join(os.path.dirname(NVCC), name), shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
        for base in nvidia.__path__:
            for sub in ("cu13", "cu12", "cuda_nvdisasm"):
                path = os.path.join(base, sub, "bin", name)
                if os.access(path, os.X_OK):
                    return path
    except ImportError:
        pass
    raise SystemExit(f"kernel_model: no {name}: pip install nvidia-cuda-nvdisasm "
                     "(tools/setup_env.sh installs it)")


def compile_cubin(source, include, flags, out):
    """Compiles one .cu to an sm_90 cubin; returns ptxas's resource report."""
    result = subprocess.run([NVCC, *flags, "-Xptxas=-v", f"-I{include}", "-cubin", source,
                             "-o", out], text=True, capture_output=True)
    if result.returncode != 0:
        raise SystemExit(f"kernel_model: nvcc failed on {source}:\n{result.stderr[-4000:]}")
    return result.stderr


def demangle(names):
    """Mangled names -> `QuantDecodeKernel<1>` (the last scope outside template arguments)."""
    out = subprocess.run(["c++filt"], input="\n".join(names), text=True,
                         capture_output=True).stdout.splitlines()
    short = {}
    for mangled, full in zip(names, out):
        full = full.replace("(anonymous namespace)", "anonymous").split("(")[0]
        depth, cut = 0, 0
        for i, ch in enumerate(full):
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == ":" and depth == 0 and full[i:i + 2] == "::":
                cut = i + 2
        short[mangled] = full[cut:]
    return short


def resources(log):
    """ptxas -v: {mangled: (registers, shared bytes)} for sm_90."""
    found, current = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_90'", line)
        if m:
            current = m.group(1)
            found[current] = (0, 0)
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            s = re.search(r"(\d+) bytes smem", line)
            found[current] = (int(m.group(1)), int(s.group(1)) if s else 0)
    return found


# ---- SASS ----


@dataclass
class Instr:
    addr: int
    text: str      # as printed, predicate included
    op: str        # opcode with modifiers, e.g. LDG.E.128.CONSTANT
    line: tuple    # (file, line) of the source, from the line info
    wait: int      # scoreboards this instruction waits on (bit mask)
    write_sb: int  # scoreboard its result sets (7: none)
    stall: int = 0      # cycles the scheduler waits before this warp's next instruction
    chain: tuple = ()   # `line` and the lines it was inlined at, innermost first
    target: int = None  # a branch's or call's target address


INSTR = re.compile(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
CONTROL = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")


def disassemble(cubin):
    """{mangled kernel name: [Instr]} from nvdisasm -gi -hex (line info with the call site of
    inlined code, and the encodings, whose high bits hold the control bits)."""
    text = subprocess.run([find_tool("nvdisasm"), "-gi", "-hex", "-c", cubin], text=True,
                          capture_output=True, check=True).stdout
    kernels, current, pending, chain, fresh = {}, None, None, [("", 0)], True
    labels, waiting = {}, []  # label -> address of the instruction after it
    for raw in text.splitlines():
        m = re.match(r"\.text\.(\S+):$", raw)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r"(\.L_x_\d+):$", raw)
        if m:
            waiting.append(m.group(1))
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', raw)
        if m:  # one line per level of inlining, innermost first
            if fresh:
                chain, fresh = [], False
            chain.append((m.group(1), int(m.group(2))))
            if m.group(3):
                chain.append((m.group(3), int(m.group(4))))
            continue
        m = INSTR.search(raw)
        if m and current is not None:
            body = m.group(2)
            tokens = body.split()
            op = tokens[1] if tokens[0].startswith("@") else tokens[0]
            pending = Instr(int(m.group(1), 16), body, op, chain[0], 0, 7,
                            chain=tuple(dict.fromkeys(chain)))
            fresh = True
            for label in waiting:
                labels[label] = pending.addr
            waiting = []
            continue
        m = CONTROL.match(raw)
        if m and pending is not None:
            # Volta-and-later control bits (bits 105..125 of the instruction): stall (4), yield
            # (1), write scoreboard (3), read scoreboard (3), wait mask (6), reuse (4).
            control = int(m.group(1), 16) >> 41
            pending.stall = control & 0xF
            pending.write_sb = (control >> 5) & 7
            pending.wait = (control >> 11) & 0x3F
            current.append(pending)
            pending = None
    for instrs in kernels.values():
        for i in instrs:
            m = re.search(r"`\((\.L_x_\d+)\)", i.text)
            if m:
                i.target = labels.get(m.group(1))
    return kernels


def conditional(ins):
    return (ins.text.startswith("@") or ins.op.startswith("BRA.DIV")
            or re.search(r"BRA\S* !?U?P\d", ins.text) is not None)


@dataclass
class Function:
    blocks: list           # [[Instr]]
    succ: list             # block -> successor blocks
    hot: set               # blocks the fast path reaches (no divergent fallback, no call-out)
    loops: dict            # header block -> set of blocks


def analyse_cfg(instrs):
    """Basic blocks, successors, the fast path and the natural loops of a kernel."""
    while instrs and (instrs[-1].op == "NOP" or instrs[-1].target == instrs[-1].addr):
        instrs = instrs[:-1]  # the padding and the self-branch after the last EXIT
    leaders = {instrs[0].addr}
    for k, ins in enumerate(instrs):
        if ins.op.startswith(("BRA", "EXIT", "RET", "CALL", "BRX", "JMX", "BREAK")):
            if k + 1 < len(instrs):
                leaders.add(instrs[k + 1].addr)
            if ins.op.startswith(("BRA", "CALL")) and ins.target is not None:
                leaders.add(ins.target)
    blocks = []
    for ins in instrs:
        if ins.addr in leaders:
            blocks.append([])
        blocks[-1].append(ins)
    start = {b[0].addr: k for k, b in enumerate(blocks)}
    succ, fast = [], []
    for k, b in enumerate(blocks):
        last = b[-1]
        nxt = [k + 1] if k + 1 < len(blocks) else []
        if last.op.startswith("BRA"):
            t = start.get(last.target)
            taken = [t] if t is not None else []
            succ.append(taken + (nxt if conditional(last) else []))
            # A divergent shuffle's fallback (BRA.DIV) is off the fast path.
            fast.append((nxt if last.op.startswith("BRA.DIV") else succ[-1]))
        elif last.op.startswith(("EXIT", "RET")):
            succ.append(nxt if last.text.startswith("@") else [])
            fast.append(succ[-1])
        else:
            succ.append(nxt)
            fast.append(nxt)
    hot = reachable(fast, 0)
    # An arm that calls out (the slow path of a 64-bit or IEEE division) is off the fast path.
    hot -= {k for k, b in enumerate(blocks) if any(i.op.startswith("CALL") for i in b)}
    return Function(blocks, succ, hot, natural_loops(succ))


def reachable(succ, entry):
    seen, stack = {entry}, [entry]
    while stack:
        for y in succ[stack.pop()]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return seen


def natural_loops(succ):
    n = len(succ)
    live = reachable(succ, 0)
    preds = [[] for _ in range(n)]
    for a in live:
        for b in succ[a]:
            preds[b].append(a)
    dom = [set(live) for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for v in sorted(live - {0}):
            ps = [dom[p] for p in preds[v]]
            new = {v} | (set.intersection(*ps) if ps else set())
            if new != dom[v]:
                dom[v], changed = new, True
    loops = {}
    for u in live:
        for h in succ[u]:
            if h in dom[u]:  # a back edge u -> h
                body, stack = {h}, ([u] if u != h else [])
                body.update(stack)
                while stack:
                    for p in preds[stack.pop()]:
                        if p not in body:
                            body.add(p)
                            stack.append(p)
                loops.setdefault(h, set()).update(body)
    return loops


# ---- one loop (or a kernel's straight-line code) ----

GLOBAL_LOADS = ("LDG", "LD.")
GLOBAL_STORES = ("STG", "ST.", "REDG", "RED.", "ATOMG", "ATOM.")
PIPES = [  # (pipe, opcode prefixes); the first match wins
    ("fp64", ("DADD", "DMUL", "DFMA", "DSETP", "DMNMX")),
    ("xu", ("MUFU", "F2I", "I2F.", "F2F.", "FRND", "POPC", "FLO", "BREV")),
    ("imad", ("IMAD", "IMUL", "IDP")),
    ("fp32", ("FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2", "FSWZADD")),
    ("shfl", ("SHFL",)),
    ("lsu", ("LDG", "STG", "LDS", "STS", "LD.", "ST.", "ATOM", "REDG", "RED.", "LDL", "STL",
             "LDSM")),
    ("alu", ("IADD", "VIADD", "LOP", "SHF", "SEL", "FSEL", "LEA", "ISETP", "FSETP", "FSET",
             "PLOP3", "PRMT", "FMNMX", "VIMNMX", "VIADDMNMX", "IMNMX", "IABS", "P2R", "R2P",
             "MOV", "CS2R", "I2FP", "F2FP", "BMSK", "SGXT", "ICMP", "FCHK", "VOTE")),
]


def pipe_of(op):
    for pipe, prefixes in PIPES:
        if op.startswith(prefixes):
            return pipe
    return "other"  # branches, barriers, uniform-datapath and control instructions


def access_bytes(op):
    """Bytes per thread of a global load or store, from its width modifier."""
    for width, size in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1),
                        (".S8", 1)):
        if width in op:
            return size
    return 4


@dataclass
class Body:
    """The instructions of one iteration of a loop on the fast path (inner loops excluded)."""
    instrs: list
    pipes: dict = field(default_factory=dict)
    loads: list = field(default_factory=list)   # opcodes of global loads
    stores: list = field(default_factory=list)  # opcodes of global stores and reductions
    wide64: int = 0        # 64-bit integer halves (.X carries, .EX compares, .WIDE, .HI, .U64)
    divisions: int = 0     # inline integer/float reciprocal sequences (MUFU.RCP)
    conversions: int = 0   # F2I, I2F, F2F, I2FP, F2FP
    calls: int = 0         # call-outs left off the fast path
    in_flight: int = 0     # most global loads in flight per thread at a stall on them
    exposures: int = 0     # stalls on global loads per iteration (each a memory latency)
    stalls: int = 0        # the scheduler's fixed stall cycles between this warp's instructions

    def issue_cycles(self, width=ISSUE_PER_SM):
        """SM cycles one warp's iteration takes of an SM's issue slots (`width` warp
        instructions a clock) and of its busiest pipe."""
        cycles = len(self.instrs) / width
        for pipe, n in self.pipes.items():
            if pipe in PIPE_LANES:
                cycles = max(cycles, n * 32 / PIPE_LANES[pipe])
        return cycles


def summarize(instrs, calls=0, loop=True):
    b = Body(instrs, calls=calls, stalls=sum(i.stall for i in instrs))
    for i in instrs:
        p = pipe_of(i.op)
        weight = 2 if i.op.startswith(("IMAD.WIDE", "IMAD.HI")) else 1
        b.pipes[p] = b.pipes.get(p, 0) + weight
        if i.op.startswith(GLOBAL_LOADS):
            b.loads.append(i.op)
        elif i.op.startswith(GLOBAL_STORES):
            b.stores.append(i.op)
        if re.search(r"\.(X|EX|WIDE|HI|U64)\b", i.op) and p in ("alu", "imad"):
            b.wide64 += 1
        if i.op.startswith("MUFU.RCP"):
            b.divisions += 1
        if i.op.startswith(("F2I", "I2F", "F2F", "I2FP", "F2FP")):
            b.conversions += 1
    b.in_flight, b.exposures = scoreboard_walk(instrs, 2 if loop else 1)
    return b


def scoreboard_walk(instrs, passes):
    """Global loads in flight per thread. Walks the instructions `passes` times (a loop twice,
    so that loads an iteration leaves outstanding for the next count) and stops at each
    instruction that waits on a scoreboard a global load set. A wait that retires a load issued
    since the previous such stall is a stall of its own (an exposure: the thread waits a memory
    latency); the loads issued since the previous stall are in flight together. A wait on loads
    issued before the previous stall costs nothing more: they were in flight with it.
    Returns the most loads in flight at a stall and the stalls per pass (the last pass)."""
    outstanding = []  # (scoreboard, issue number) of global loads not yet waited on
    issued, last_stall, most, stalls = 0, 0, 0, 0
    for p in range(passes):
        counting = p == passes - 1
        for i in instrs:
            retired = []
            m = i.op.startswith("DEPBAR") and re.search(r"SB(\d), (0x[0-9a-f]+|\d+)", i.text)
            if m:  # DEPBAR.LE SBn, k: wait until at most k of scoreboard n's are outstanding
                sb, keep = int(m.group(1)), int(m.group(2), 0)
                mine = [x for x in outstanding if x[0] == sb]
                retired = mine[:max(0, len(mine) - keep)]
            elif i.wait:
                retired = [x for x in outstanding if i.wait >> x[0] & 1]
            if any(n >= last_stall for _, n in retired):
                batch = sum(1 for _, n in outstanding if n >= last_stall)
                if counting:
                    most, stalls = max(most, batch), stalls + 1
                last_stall = issued
            outstanding = [x for x in outstanding if x not in retired]
            if i.op.startswith(GLOBAL_LOADS) and i.write_sb != 7:
                outstanding.append((i.write_sb, issued))
                issued += 1
    return most, stalls


@dataclass
class Kernel:
    name: str
    registers: int
    shared: int
    f: Function

    def loops(self):
        """[(header block, blocks)] of every loop, outermost first."""
        return sorted(self.f.loops.items(), key=lambda hb: (-len(hb[1]), hb[0]))

    def own_blocks(self, header):
        """A loop's blocks less those of the loops inside it."""
        body = self.f.loops[header]
        inner = [b for g, b in self.f.loops.items() if g != header and b < body]
        return body - set().union(*inner) if inner else body

    def body(self, header, cold_lines=()):
        """One iteration of a loop on the fast path: its own blocks on a path from the header
        back to it that enters no block running code of `cold_lines` (source lines, as (path
        suffix, line), that this data does not run). A block from which every way back runs
        through cold code is cold too: where nvcc unswitches a loop on a condition this data
        does not take, the copy made for it is cold from its first block."""
        own = self.own_blocks(header)
        body = self.f.loops[header]
        seeds = {k for k in body if any(runs_line(i, cold_lines) for i in self.f.blocks[k])}
        hot = {header} if header not in seeds else set()
        stack = list(hot)
        while stack:
            for y in self.f.succ[stack.pop()]:
                if y in body and y not in hot and y not in seeds:
                    hot.add(y)
                    stack.append(y)
        # Back from the latches (the blocks that branch to the header), through hot blocks.
        # Where no latch is reached, the cold lines share a block with the hot path (an arm of
        # a conditional expression) and cut every way back: the forward walk stands.
        back = {u for u in hot if header in self.f.succ[u]}
        stack = list(back)
        while stack:
            y = stack.pop()
            for u in hot:
                if u not in back and y in self.f.succ[u]:
                    back.add(u)
                    stack.append(u)
        if back:
            hot &= back | {header}
        hot &= own & self.f.hot
        calls = sum(1 for k in own for i in self.f.blocks[k] if i.op.startswith("CALL"))
        return summarize([i for k in sorted(hot) for i in self.f.blocks[k]], calls)

    def outside(self, cold_lines=()):
        """The fast path's instructions outside every loop: once per thread; less the blocks
        that run code of `cold_lines` (what one thread of a launch runs, not every thread)."""
        in_loops = set().union(*self.f.loops.values()) if self.f.loops else set()
        cold = {k for k, b in enumerate(self.f.blocks) if any(runs_line(i, cold_lines) for i in b)}
        return summarize([i for k in sorted(self.f.hot - in_loops - cold)
                          for i in self.f.blocks[k]], loop=False)

    def closing_line(self, header):
        """(path, line) of the branch that closes a loop."""
        body = self.f.loops[header]
        latch = max((u for u in body if header in self.f.succ[u]),
                    key=lambda u: self.f.blocks[u][-1].addr)
        return self.f.blocks[latch][-1].line


def runs_line(instr, lines):
    """Whether `instr` runs code of `lines`: a reconvergence (BSYNC, BSSY) does not, though
    nvcc gives the join after a conditional the conditional's last line."""
    return not instr.op.startswith(("BSYNC", "BSSY")) and matches(instr, lines)


def matches(instr, lines):
    return any(loc[0].endswith(path) and loc[1] == line
               for path, line in lines for loc in instr.chain)


def analyse_sources(sources, include, flags_root=ROOT):
    """{kernel name: Kernel} for every kernel in the .cu files (compiled two at a time), with
    the nvcc flags of the checkout at `flags_root`."""
    flags = nvcc_flags(flags_root)
    scratch = tempfile.mkdtemp(prefix="kernel_model.")
    try:
        def one(source):
            cubin = os.path.join(scratch, os.path.basename(source) + ".cubin")
            log = compile_cubin(source, include, flags, cubin)
            return disassemble(cubin), resources(log)
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(one, sources))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    names = demangle([m for sass, _ in results for m in sass])
    kernels = {}
    for sass, res in results:
        for m, instrs in sass.items():
            regs, smem = res.get(m, (0, 0))
            kernels[names[m]] = Kernel(names[m], regs, smem, analyse_cfg(instrs))
    return kernels


def source_line(path, line):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    except OSError:
        return ""


def loop_report(kernels):
    """The --loops output: every loop of every kernel, with the source line that closes it."""
    report = {}
    for name, k in sorted(kernels.items()):
        rows = []
        for header, blocks in k.loops():
            b = k.body(header)
            path, line = k.closing_line(header)
            rows.append({"header": hex(k.f.blocks[header][0].addr),
                         "line": f"{os.path.basename(path)}:{line}",
                         "source": source_line(path, line),
                         "inner": [hex(k.f.blocks[g][0].addr) for g, gb in k.f.loops.items()
                                   if g != header and gb < blocks],
                         "instructions": len(b.instrs), "loads": b.loads, "stores": b.stores,
                         "in_flight": b.in_flight, "exposures": b.exposures, "calls": b.calls})
        report[name] = {"registers": k.registers, "shared": k.shared, "loops": rows,
                        "outside": len(k.outside().instrs)}
    return report


# ---- what each kernel is given to do ----


@dataclass
class Trip:
    """A source loop of a kernel: named by (a unique part of) the text of the line its closing
    branch maps to, in `file` (default: the kernel's .cu file; `nth` picks among equal lines),
    and how many warp-iterations it runs in one launch. `loads` is the global loads one source
    iteration issues: the SASS loop's loads over it is the unrolling (none given: not
    unrolled; a version unrolled more than `per_entry`, the iterations each entry of the loop
    runs, never runs). `cold` lists lines (file, text) whose code this data does not run, or
    gives them from the shape."""
    anchor: str
    iterations: object
    loads: int = 0
    file: str = ""
    nth: int = 1
    cold: tuple = ()
    per_entry: int = 0


@dataclass
class Launch:
    """A kernel's launch (from its host-side launcher) and its loops."""
    file: str
    threads: int
    blocks: object
    trips: list = field(default_factory=list)


def ceil_div(a, b):
    return -(-int(a) // int(b))


# The grids' caps of the tree work() last read (grid_caps): BlocksFor's, the copies' (identity's
# and cast's) and the checksum's.
GRID_CAPS = {}


def grid_caps(tree):
    """The caps on a grid's blocks in a tree's sources: MaxGridBlocks's default for every launch
    (device_ops.cu), or, in trees before it, 65535 * 16 for BlocksFor, 2048 for the copies and
    4096 for the checksum."""
    with open(os.path.join(tree, "codecs", "cuda", "device_ops.cu")) as f:
        found = re.search(r"int MaxGridBlocks\(\) \{\s*constexpr int kDefault = (\d+);", f.read())
    if found:
        cap = int(found.group(1))
        return {"blocks_for": cap, "copy": cap, "checksum": cap}
    return {"blocks_for": 65535 * 16, "copy": 2048, "checksum": 4096}


def blocks_for(items, per_block, cap="blocks_for"):
    """BlocksFor in codecs/cuda/device_ops.cuh."""
    return max(1, min(GRID_CAPS[cap], ceil_div(items, per_block)))


def checksum_blocks(s):
    """ChecksumBlocks in codecs/cuda/device_ops.cu."""
    return blocks_for(s["bytes"] // 4 + 1, 256, "checksum")


def identity_blocks(s):
    """LaunchIdentity in codecs/cuda/device_ops.cu (16-byte path: 64 bytes a thread)."""
    return blocks_for(s["input_bytes"] // 64 + 1, 256, "copy")


def vector_blocks(s, per_thread):
    """The grid of a kernel whose threads take `per_thread` elements a pass (cast_kernels.cu's
    Blocks)."""
    return blocks_for(s["numel"] // per_thread + 1, 256, "copy")


def unrolled_trips(vectors, blocks, unroll=4):
    """Warp-iterations of a grid-stride loop that takes `unroll` vectors a thread a pass."""
    stride = blocks * 256
    return vectors // (unroll * stride) * stride / 32


def leftover_trips(vectors, blocks, unroll=4):
    """... and of the loop after it that takes the vectors left, one a thread a pass."""
    return vectors % (unroll * blocks * 256) / 32


def identity_stride(s):
    return identity_blocks(s) * 256


def identity_vectors(s):
    return s["input_bytes"] // 16


def quant_lane_vectors(s):
    """The 16-byte float32 vectors a lane of quant's vector kernels handles per group."""
    return ceil_div(s["group"] // 4, 32)


def quant_vector_cold(s):
    """What quant's vector encode does not run on these shapes: the draws of a group straddling
    a 2^32-element stream, and whichever way of writing code words the bits do not take. (The
    partial vector at the tensor's end is a call-out, off the fast path.)"""
    return [UNIFORM_FLOAT, FURTHER_STREAM] + group_words_cold(4 * s["bits"])


def group_words_cold(vector_bits):
    """The way of writing a group's code words (device_ops.cuh's GroupCodeWords) that a
    vector's `vector_bits` do not take: from 32 bits on no lanes share a word."""
    if vector_bits >= 32:
        return [(OPS_H, "uint32_t word = static_cast<uint32_t>(codes) << ((j & (lanes_per_word_ - 1))"),
                (OPS_H, "const uint32_t shared = __shfl_sync(0xffffffffu, row_word_[t], from & 31);")]
    return [(OPS_H, "if (j < vectors_) {  // whole words of this lane's own"),
            (OPS_H, "const uint32_t word = static_cast<uint32_t>(uint64_t{codes} >> (32 * q));")]


# What the last block of a launch that closes it (device_ops.cuh's CloseLaunch) runs in one
# thread: the header written or the buffer checked. Not per thread.
CLOSING = (("codecs/cuda/device_ops.cuh", "BufferFailures(closing.header_at"),
           ("codecs/cuda/device_ops.cuh", "WriteFinalHeader(closing.header, false, status"))
QUANT = "codecs/cuda/quant_kernels.cu"
# eb's quantizer tries the neighbouring bin only for a value at a bin's edge that the rounded
# division put in the wrong one.
EB_SECOND_BIN = (("codecs/internal/eb_math.h", "const int32_t other = a > decoded ? m + 1 : m - 1;"),
                 ("codecs/internal/eb_math.h",
                  "if (other >= 1 && other <= kMaxCode && BinFits<K>(a, other, qz)) {"))
EB = "codecs/cuda/eb_kernels.cu"
DIVISION = "codecs/cuda/division_kernels.cu"
# division's ways for tensors of 2^32 values and more, which the modelled shapes are not.
DIVISION_WIDE = ((DIVISION, ": division_math::MeanOf(l, p, j, starts);"),
                 (DIVISION, ": division_math::MeanOf(l, p, j);"),
                 (DIVISION, ": j / l.group_length;"), (DIVISION, ": i / l.plane;"))
# The decode of a vector whose values do not share one approximation (not these planes').
DECODE_OWN_VALUES = ((DIVISION, "values[e] = division_math::Reconstruct(lfc.AtSumming(l, d, p, j0 + e"),)
OPS = "codecs/cuda/device_ops.cu"
OPS_H = "codecs/cuda/device_ops.cuh"
UNIFORM_FLOAT = ("codecs/internal/portable.h",
                 "return UniformFromHashedKey(Hash32(UniformKey(seed, index)), index);")
# A group in a further 2^32-element stream than the last (GroupDraws): none below 2^32 values.
FURTHER_STREAM = ("codecs/internal/portable.h", "hashed_ = Hash32(UniformKey(seed_, first));")


def work(kernels_tree):
    """{kernel: Launch} of the kernels in codecs/cuda at this tree. `s` is the shape: numel,
    element_bytes, and what its codec's layout makes of it (shape_of)."""
    GRID_CAPS.update(grid_caps(kernels_tree))
    w = {
        "ChecksumKernel": Launch(OPS, 256, checksum_blocks, [
            Trip("w < full_words; w += stride", lambda s: s["bytes"] / 4 / 32, loads=1),
            Trip("for (uint64_t b = 0; b < bytes % 4; ++b)", lambda s: 0)]),  # one thread
        "FinalizeHeaderKernel": Launch(OPS, 1, lambda s: 1),
        "CheckHeaderKernel": Launch(OPS, 1, lambda s: 1),
        "PoisonKernel": Launch(OPS, 256, lambda s: min(32, ceil_div(s["numel"], 256))),
        # identity: a capped grid, each thread 4 independent 16-byte vectors per
        # iteration (aligned input and output), the vectors left over, then words and bytes past
        # the last vector (none at these sizes).
        "IdentityKernel": Launch(OPS, 256, identity_blocks, [
            Trip("i + (kCopyUnroll - 1) * stride < vectors;",
                 lambda s: identity_vectors(s) // (4 * identity_stride(s)) * identity_stride(s)
                 / 32, loads=4),
            Trip("for (; i < vectors; i += stride)",
                 lambda s: identity_vectors(s) % (4 * identity_stride(s)) / 32, loads=1),
            Trip("w < words; w += stride", lambda s: 0),
            Trip("for (uint64_t b = words * 4; b < bytes; ++b)", lambda s: 0)]),
        # quant: one warp per group of 256; the range pass, then the codes (each lane one value
        # per 32), the codes of 32 / bits lanes OR-ed into a word by log2(32 / bits) shuffles.
        "QuantEncodeKernel": Launch(QUANT, 256, lambda s: blocks_for(s["groups"], 8), [
            Trip("g < groups;", lambda s: s["groups"]),
            Trip("for (uint64_t i = first + lane; i < last; i += 32)",
                 lambda s: s["groups"] * s["group"] / 32, loads=1),
            Trip("for (uint32_t base = 0; base < layout.group_size; base += 32)",
                 lambda s: s["groups"] * s["group"] / 32, loads=1, cold=(UNIFORM_FLOAT,)),
            Trip("for (uint32_t offset = 1; offset < per_word; offset *= 2)",
                 lambda s: s["groups"] * s["group"] / 32 * math.log2(s["per_word"]))]),
        # quant where the input is 16-byte aligned: one warp per group, each lane its 16-byte
        # vectors loaded first (two of float32 in a group of 256), the range and the codes from
        # those registers; the codes of a vector (4 values) are bits * 4 bits, ORed across
        # 32 / (bits * 4) lanes by shuffles, or whole words of the lane's own at 8 bits.
        "QuantEncodeVectorKernel": Launch(QUANT, 256, lambda s: blocks_for(s["groups"], 8), [
            Trip("g < layout.groups;", lambda s: s["groups"], loads=2, cold=quant_vector_cold),
            Trip("offset < lanes_per_word_; offset *= 2",
                 lambda s: s["groups"] * quant_lane_vectors(s)
                 * math.log2(max(1, 32 // (4 * s["bits"]))), file=OPS_H)]),
        # ... and its decode where the output is: a lane a vector of output at a time, from
        # the code word its vector's codes are in (summed for the checksum by the lane whose
        # vector starts it).
        "QuantDecodeVectorKernel": Launch(QUANT, 256, lambda s: blocks_for(s["groups"], 8), [
            Trip("g < layout.groups;", lambda s: s["groups"], nth=1),
            Trip("for (uint32_t j = lane; j < vectors; j += 32)",
                 lambda s: s["groups"] * quant_lane_vectors(s), loads=1, per_entry=1,
                 cold=((QUANT, "if (j * kPer + e < n) elements::Store<K>(output, first"),))]),
        # eb (1-D blocks of 128): a thread block of 4 warps per chunk of 32 blocks, 8 blocks a
        # warp: planned, then (after warp 0's look-back) packed. No chunk is planned again by a
        # look-back (that takes a predecessor that has not started), no block is verbatim and
        # no value an outlier in this data.
        "EbRangeKernel": Launch(EB, 256, lambda s: blocks_for(s["numel"], 256 * 8), [
            Trip("i += kRangeLoads * stride) {", lambda s: s["numel"] / 32 / 4, loads=4)]),
        "EbQuantizerKernel": Launch(EB, 1, lambda s: 1),
        "EbEncodeKernel": Launch(EB, 128, lambda s: blocks_for(s["chunks"], 1), [
            Trip("c < l.chunks; c += gridDim.x", lambda s: s["chunks"] * 4),
            Trip("for (uint32_t t = lane; t < eb_math::kBlockValues; t += 32) pack[t] = 0;",
                 lambda s: blocks_for(s["chunks"], 1) * 4 * 4),
            Trip("bi < (warp + 1) * kBlocksPerWarp; ++bi", lambda s: s["blocks"], nth=1,
                 cold=((EB, ": PlanBlock<K>(input, l, qz, first + bi, codes[bi], lane).choice;"),
                       ) + EB_SECOND_BIN),
            # LoadFour's one-at-a-time loads: the last block only (an aligned input)
            Trip("x[j] = j < n ? elements::Load<K>(input, i + j) : 0.0f;", lambda s: 0),
            Trip("bi < (warp + 1) * kBlocksPerWarp; ++bi", lambda s: s["blocks"], nth=2,
                 cold=((EB, "OrBits(pack, elements::LoadBits<kBytes>(input, origin + s), s * width"),
                       (EB, "const Tile t = eb_math::TileOf(l, b);"), (EB, "count = t.count;"),
                       (EB, "const Slot slot = SlotOf(l, t, kSlotsPerLane * lane + j);"))),
            Trip("for (uint32_t s = s0; s < s0 + kSlotsPerLane && s < count; ++s) {", lambda s: 0),
            Trip("for (uint32_t w = lane; w < n; w += 32)",
                 lambda s: s["blocks"] * ceil_div(s["block_words"], 32)),
            Trip("while (j > 0)", lambda s: s["chunks"]),
            Trip("spin < kLookBackSpins", lambda s: 0),
            Trip("for (uint64_t b = first; b < last; ++b)", lambda s: 0)]),
        "EbOutlierKernel": Launch(EB, 128, lambda s: blocks_for(s["chunks"], 4), [
            Trip("c < l.chunks; c += warp_stride", lambda s: s["chunks"]),
            Trip("for (uint64_t b = first; b < last; ++b)", lambda s: 0)]),
        "EbValidateKernel": Launch(EB, 128, lambda s: blocks_for(s["chunks"], 4), [
            Trip("c < l.chunks;", lambda s: s["chunks"])]),
        # a warp per chunk, block after block; a 1-D block in registers (DecodeRun), 4 values a
        # lane, one 16-byte store
        "EbDecodeKernel": Launch(EB, 128, lambda s: blocks_for(s["chunks"], 4), [
            Trip("c < l.chunks; c += warp_stride", lambda s: s["chunks"]),
            Trip("for (uint32_t bi = 0; bi < blocks; ++bi)", lambda s: s["blocks"],
                 cold=((EB, "const Tile t = eb_math::TileOf(l, b);"),
                       (EB, "for (uint32_t s = s0; s < s0 + kSlotsPerLane && s < count; ++s) {"),
                       (EB, "const uint32_t bits = kBytes == 4 ? data[s] : (data[s / 2] >> (16"),
                       (EB, "for (uint32_t j = 0; j < n && j < 4; ++j) elements::Store<K>"))),
            # verbatim blocks, the last block's one-at-a-time stores, and the 2-D tiles' loops:
            # not in these 1-D, compressible data
            Trip("for (uint32_t s = s0; s < s0 + kSlotsPerLane && s < count; ++s) {", lambda s: 0),
            Trip("for (uint32_t j = 0; j < n && j < 4; ++j) elements::Store<K>", lambda s: 0),
            Trip("for (uint32_t i = lane; i < t.count; i += 32)", lambda s: 0),
            Trip("for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc] +=", lambda s: 0),
            Trip("for (uint32_t col = 1; col < tc; ++col)", lambda s: 0),
            Trip("for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc + lane]", lambda s: 0)]),
        # division on [P, 64, 64, 64]: LFC words (two 8 x 8 means) a thread each; residual
        # groups of 128 a warp each (range pass, then codes as quant's); decode a value a thread.
        "DivisionLfcKernel": Launch(DIVISION, 256, lambda s: blocks_for(s["lfc_words"], 256), [
            Trip("w < layout.lfc_words;", lambda s: s["lfc_words"] / 32),
            Trip("for (uint64_t h = h0; h < h1; ++h)", lambda s: s["lfc_words"] / 32 * 2 * 8,
                 file="codecs/internal/division_math.h"),
            Trip("for (uint64_t w = w0; w < w1; ++w)", lambda s: s["lfc_words"] / 32 * 2 * 8 * 8,
                 loads=1, file="codecs/internal/division_math.h")]),
        # ... where a window's rows are whole 16-byte vectors (the modelled shapes; the scalar
        # kernel's anchors are the 2026-11-27 tree's): an 8-wide float32 row two vectors, a
        # window's rows unrolled 4 times (8 loads in flight a thread); nvcc keeps a copy of a
        # word's two means for each `two`, the modelled shapes' the costlier.
        "DivisionLfcVectorKernel": Launch(DIVISION, 256, lambda s: blocks_for(s["lfc_words"], 256), [
            Trip("w < layout.lfc_words;", lambda s: s["lfc_words"] / 32),
            Trip("for (uint64_t half = 0; half < 2; ++half) {", lambda s: s["lfc_words"] / 32 * 2,
                 file="codecs/internal/division_math.h"),
            Trip("for (uint64_t h = 0; h < win.rows; ++h) {", lambda s: s["lfc_words"] / 32 * 2 * 8,
                 loads=2)]),
        "DivisionResidualKernel": Launch(DIVISION, 256, lambda s: blocks_for(s["groups"], 8), [
            Trip("g < l.groups;", lambda s: s["groups"]),
            Trip("for (uint64_t k = lane; k < n; k += 32)", lambda s: s["groups"] * s["group"] / 32,
                 loads=2, cold=DIVISION_WIDE),
            Trip("for (uint64_t base = 0; base < n; base += 32)",
                 lambda s: s["groups"] * s["group"] / 32, loads=2,
                 cold=(UNIFORM_FLOAT,) + DIVISION_WIDE),
            Trip("for (uint32_t offset = 1; offset < per_word; offset *= 2)",
                 lambda s: s["groups"] * s["group"] / 32 * math.log2(s["per_word"]))]),
        # ... where the input is aligned and a vector's values share a window (the modelled
        # shapes): two groups of 128 a warp, a half-warp each, a lane's two 16-byte vectors
        # loaded once with the one mean each one's values share, the residuals kept in
        # registers for the range and the codes; a vector's 8 bits of codes ORed across 4 lanes
        # by two shuffles, a row of the two groups at a time.
        "DivisionResidualVectorKernel": Launch(
                DIVISION, 256, lambda s: blocks_for(ceil_div(s["groups"], 2), 8), [
            Trip("w < pairs;", lambda s: ceil_div(s["groups"], 2), loads=4,
                 cold=lambda s: [UNIFORM_FLOAT, FURTHER_STREAM, *DIVISION_WIDE,
                                 *group_words_cold(4 * 32 // s["per_word"])]),
            Trip("offset < lanes_per_word_; offset *= 2",
                 lambda s: ceil_div(s["groups"], 2) * 2 * math.log2(32 // (4 * 32 // s["per_word"])),
                 file=OPS_H)]),
        # decode: a value a thread (the kernels of 2026-11-27; HEAD's below)
        "DivisionDecodeKernel": Launch(DIVISION, 256, lambda s: blocks_for(s["numel"], 256), [
            Trip("i < numel; i += stride", lambda s: s["numel"] / 32, loads=3)]),
    }
    # The other codecs (HEAD's table only): a value, word or group a thread, grid-stride.
    cast, mask, pool, bitpack = ("codecs/cuda/cast_kernels.cu", "codecs/cuda/mask_kernels.cu",
                                 "codecs/cuda/pool_kernels.cu", "codecs/cuda/bitpack_kernels.cu")

    def per_value():
        return Trip("i < numel; i += stride", lambda s: s["numel"] / 32)

    w.update({
        # cast: a capped grid, each thread 4 independent 16-byte vectors per
        # iteration (4 floats into two payload words encoding, 8 halves into 8 floats
        # decoding), the vectors left over, then the words past the last vector (none here).
        "CastEncodeKernel": Launch(cast, 256, lambda s: vector_blocks(s, 16), [
            Trip("i + (kUnroll - 1) * stride < vectors;",
                 lambda s: unrolled_trips(s["numel"] // 4, vector_blocks(s, 16)), loads=4),
            Trip("for (; i < vectors; i += stride) {",
                 lambda s: leftover_trips(s["numel"] // 4, vector_blocks(s, 16)), loads=1),
            Trip("for (uint64_t w = word + first; w < words; w += stride) {", lambda s: 0)]),
        "CastDecodeKernel": Launch(cast, 256, lambda s: vector_blocks(s, 32), [
            Trip("i + (kUnroll - 1) * stride < vectors;",
                 lambda s: unrolled_trips(s["numel"] // 8, vector_blocks(s, 32)), loads=4),
            Trip("for (; i < vectors; i += stride) {",
                 lambda s: leftover_trips(s["numel"] // 8, vector_blocks(s, 32)), loads=1),
            Trip("for (uint64_t w = word + first; w < words; w += stride) {", lambda s: 0)]),
        # mask of a bool tensor: a thread per 16-byte vector (16 elements), two lanes' bits ORed
        # into a word by one shuffle (unrolled: a constant count); decode a thread per 16-byte
        # vector of output
        "MaskEncodeKernel": Launch(mask, 256, lambda s: blocks_for(s["words"] * 2, 256), [
            Trip("base < words * kLanesPerWord;", lambda s: s["words"] * 2 / 32, loads=1)]),
        "MaskDecodeKernel": Launch(mask, 256, lambda s: blocks_for(s["numel"] // 16 // 4, 256), [
            Trip("v + (kUnroll - 1) * stride < vectors;",
                 lambda s: unrolled_trips(s["numel"] // 16, blocks_for(s["numel"] // 16 // 4, 256)),
                 loads=4),
            Trip("for (; v < vectors; v += stride)",
                 lambda s: leftover_trips(s["numel"] // 16, blocks_for(s["numel"] // 16 // 4, 256)),
                 loads=1),
            Trip("for (uint64_t i = done + first; i < numel; i += stride)", lambda s: 0)]),
        # pool of float32 by 4: a thread 4 means (payload words) a pass, each one 16-byte vector; decode
        # a thread per 16-byte vector of output (one mean)
        "PoolEncodeKernel": Launch(pool, 256, lambda s: blocks_for(s["words"] // 4, 256), [
            Trip("w + (kUnroll - 1) * stride < tiled_words;",
                 lambda s: unrolled_trips(s["words"], blocks_for(s["words"] // 4, 256)), loads=4),
            Trip("for (; w < words; w += stride)",
                 lambda s: leftover_trips(s["words"], blocks_for(s["words"] // 4, 256)),
                 cold=((pool, ": pool_math::EncodeWord<K>(input, shape, w, &nonfinite);"),
                       ("codecs/internal/pool_math.h", "const float mean = WindowMean<K>(input, s, w);"),
                       ("codecs/internal/pool_math.h",
                        "sum = portable::Add(sum, elements::Load<K>(input, first + j));"))),
            Trip("for (uint32_t v = 0; v < vectors; ++v)",
                 lambda s: leftover_trips(s["words"], blocks_for(s["words"] // 4, 256)), loads=1),
            Trip("for (uint64_t j = 0; j < count; ++j)", lambda s: 0,
                 file="codecs/internal/pool_math.h")]),
        "PoolDecodeKernel": Launch(pool, 256, lambda s: blocks_for(s["numel"] // 4, 256), [
            Trip("for (uint64_t i = first; i < vectors; i += stride)",
                 lambda s: s["numel"] / 4 / 32, loads=1),
            Trip("for (uint64_t i = done + first; i < numel; i += stride)", lambda s: 0)]),
        "BitpackRangeKernel": Launch(bitpack, 256, lambda s: blocks_for(s["numel"], 256), [
            per_value()]),
        "BitpackParamsKernel": Launch(bitpack, 1, lambda s: 1),
        "BitpackCheckKernel": Launch(bitpack, 1, lambda s: 1),
        # a warp per pass of 4 groups of 32 (a lane per element of each), storing the pass's
        # 4 x bits words 32 at a time, about 8 passes a warp; each warp zeroes its 256 shared
        # words once
        "BitpackEncodeKernel": Launch(bitpack, 256, lambda s: blocks_for(s["groups"], 256), [
            Trip("g0 < groups; g0 += warp_stride", lambda s: s["groups"] / 4, loads=4),
            Trip("t < kPassWords; t += 32) words[t] = 0;",
                 lambda s: blocks_for(s["groups"], 256) * 8 * 8),
            Trip("t < pass_words; t += 32", lambda s: s["groups"] / 4 * ceil_div(4 * s["bits"], 32))]),
        "BitpackDecodeKernel": Launch(bitpack, 256, lambda s: blocks_for(s["numel"], 256), [
            per_value()]),
    })
    with open(os.path.join(kernels_tree, EB)) as f:
        single_pass = "EbEncodeKernel" in f.read()
    if not single_pass:  # the kernels of 2026-11-27: plan, scan and write, a warp per chunk
        del w["EbEncodeKernel"], w["EbOutlierKernel"]
        w.update({
            "EbRangeKernel": Launch(EB, 256, lambda s: blocks_for(s["numel"], 256 * 8), [
                Trip("i < numel; i += stride", lambda s: s["numel"] / 32, loads=1)]),
            "EbPlanKernel": Launch(EB, 128, lambda s: blocks_for(s["chunks"], 4), [
                Trip("c < l.chunks; c += warp_stride", lambda s: s["chunks"]),
                Trip("for (uint64_t b = first; b < last; ++b)", lambda s: s["blocks"])]),
            "EbScanKernel": Launch(EB, 1024, lambda s: 1, [
                Trip("for (uint64_t c = begin; c < end; ++c)", lambda s: s["chunks"] / 32, nth=1),
                Trip("for (uint64_t c = begin; c < end; ++c)", lambda s: s["chunks"] / 32, nth=2)]),
            "EbWriteKernel": Launch(EB, 128, lambda s: blocks_for(s["chunks"], 4), [
                Trip("c < l.chunks; c += warp_stride", lambda s: s["chunks"]),
                Trip("for (uint64_t b = first; b < last; ++b)", lambda s: s["blocks"]),
                # a lane packs one data word; PackWord reads the values that overlap it
                Trip("word < state.choice.data_words; word += 32",
                     lambda s: s["blocks"] * ceil_div(s["block_words"], 32)),
                Trip("for (uint32_t i = first_bit / width; i < count; ++i)",
                     lambda s: s["blocks"] * ceil_div(s["block_words"], 32)
                     * (128 / s["block_words"] + 1), file="codecs/internal/eb_math.h")]),
            "EbDecodeKernel": Launch(EB, 128, lambda s: blocks_for(s["chunks"], 4), [
                Trip("c < l.chunks; c += warp_stride", lambda s: s["chunks"]),
                Trip("for (uint32_t bi = 0; bi < blocks; ++bi)", lambda s: s["blocks"]),
                Trip("for (uint32_t i = lane; i < t.count; i += 32)", lambda s: 0),
                Trip("for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc] +=", lambda s: 0),
                Trip("for (uint32_t col = 1; col < tc; ++col)", lambda s: 0),
                Trip("for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc + lane]", lambda s: 0)]),
        })
    with open(os.path.join(kernels_tree, DIVISION)) as f:
        decode_vectors = "DecodeVector<K>(" in f.read()
    if decode_vectors:  # a thread per 16-byte vector of output (the planes hold whole vectors)
        # The modelled [n, 64, 64, 64] planes take OneWindow's path: a vector of a row's values
        # in one 8-wide window (loads: its group's parameter word, its code words, one mean and
        # the LFC word a window's first value checks).
        w["DivisionDecodeKernel"] = Launch(DIVISION, 256, lambda s: blocks_for(s["numel"] // 4, 256), [
            Trip("for (uint64_t v = first; v < vectors; v += stride) {",
                 lambda s: s["numel"] / 4 / 32, loads=5, cold=DIVISION_WIDE + DECODE_OWN_VALUES),
            Trip("for (uint64_t i = done + first; i < numel; i += stride)", lambda s: 0)])
        # division_dct at keep 1 on the same planes (its encode's first launch, the residual
        # and the decode): four 64 x 64 planes a block item, a thread a column summing down the
        # rows (4 loads in flight), then a thread a plane sums the 64 column sums (the loop
        # unrolled 4 times); the residual and decode as division's vector kernels, the plane's
        # one coefficient for their means (the decode sums the LFC words apart).
        w["DctMeanKernel"] = Launch(DIVISION, 256, lambda s: blocks_for(s["planes"] // 4, 1), [
            Trip("for (uint64_t b = blockIdx.x; b < t.items; b += gridDim.x) {",
                 lambda s: s["planes"] // 4 * 8),
            Trip("for (uint64_t i = threadIdx.x; i < items; i += blockDim.x) coefficients[i] = 0.0f;",
                 lambda s: s["planes"] // 4),
            Trip("for (uint64_t w0 = 0; w0 < W; w0 += t.columns) {", lambda s: s["planes"] // 4 * 8),
            Trip("for (uint64_t h = 0; h < H; ++h) {", lambda s: s["numel"] / 32, loads=1),
            Trip("for (uint64_t i = threadIdx.x; i < items; i += blockDim.x) {  // along w",
                 lambda s: s["planes"] // 4),
            Trip("for (uint64_t k = 0; k < tile; ++k) {", lambda s: s["planes"] // 4 * 64 // 4),
            Trip("for (uint64_t i = threadIdx.x; i < items; i += blockDim.x) {",
                 lambda s: s["planes"] // 4, nth=2)])
        w["DctResidualVectorKernel"] = Launch(
                DIVISION, 256, lambda s: blocks_for(ceil_div(s["groups"], 2), 8), [
            Trip("w < pairs;", lambda s: ceil_div(s["groups"], 2), loads=4,
                 cold=lambda s: [UNIFORM_FLOAT, FURTHER_STREAM, *DIVISION_WIDE,
                                 *group_words_cold(4 * 32 // s["per_word"])]),
            Trip("offset < lanes_per_word_; offset *= 2",
                 lambda s: ceil_div(s["groups"], 2) * 2 * math.log2(32 // (4 * 32 // s["per_word"])),
                 file=OPS_H)])
        w["DctMeanDecodeKernel"] = Launch(DIVISION, 256, lambda s: blocks_for(s["numel"] // 4, 256), [
            Trip("for (uint64_t v = first; v < vectors; v += stride) {",
                 lambda s: s["numel"] / 4 / 32, loads=3, cold=DIVISION_WIDE + DECODE_OWN_VALUES),
            Trip("for (uint64_t i = done + first; i < numel; i += stride)", lambda s: 0),
            Trip("w < l.lfc_words;", lambda s: s["lfc_words"] / 32, loads=1)])
    quant_decode = os.path.join(kernels_tree, QUANT)
    with open(quant_decode) as f:
        source = f.read()
    one_warp_per_group = "for (uint32_t k = lane; k < n; k += 32)" in source
    if one_warp_per_group:
        w["QuantDecodeKernel"] = Launch(QUANT, 256, lambda s: blocks_for(s["groups"], 8), [
            Trip("g < layout.groups;", lambda s: s["groups"]),
            Trip("for (uint32_t k = lane; k < n; k += 32)", lambda s: s["groups"] * s["group"] / 32,
                 loads=1)] + ([Trip("w < layout.words_per_group; w += 32",
                                    lambda s: s["groups"] * ceil_div(s["group"] * s["bits"] // 32,
                                                                     32), loads=1)]
                              if "GroupTerms(" in source else []))
    else:  # a thread per value (the kernels of 2026-11-27)
        w["QuantDecodeKernel"] = Launch(QUANT, 256, lambda s: blocks_for(s["numel"], 256), [
            Trip("i < layout.numel;", lambda s: s["numel"] / 32, loads=2)])
    return w



# ---- the model ----

K_OF_DTYPE = {"float32": 1, "float16": 2, "bfloat16": 3}  # elements::Kind


def shape_of(spec, dtype, nbytes, ratio=1.0):
    """What a codec's layout makes of `nbytes` of input, as gpu_benchmark.py encodes it (1-D,
    division as [n, 64, 64, 64]); `ratio` (input over buffer bytes, measured) sizes eb's data."""
    width = {"float32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "int64": 8}[dtype]
    n = nbytes // width
    s = {"numel": n, "element_bytes": width, "input_bytes": nbytes}
    if spec.startswith("quant"):
        bits = int(spec[len("quant"):])
        s.update(group=256, groups=ceil_div(n, 256), per_word=32 // bits, bits=bits)
    elif spec.startswith("eb"):
        blocks = ceil_div(n, 128)
        # a block's data words: its 128 values' bytes over the compression ratio
        s.update(blocks=blocks, chunks=ceil_div(blocks, 32),
                 block_words=max(1, round(128 * width / 4 / ratio)))
    elif spec == "division":
        planes = n // 4096
        s.update(lfc_words=planes * 64 // 2, group=128, groups=planes * 32, per_word=16)
    elif spec == "division_dct":  # keep 1: a coefficient a plane
        planes = n // 4096
        s.update(planes=planes, lfc_words=ceil_div(planes, 2), group=128, groups=planes * 32,
                 per_word=16)
    elif spec == "cast":
        s.update(words=ceil_div(n, 2))
    elif spec == "mask":
        s.update(words=ceil_div(n, 32))
    elif spec == "pool":
        s.update(window=4, words=ceil_div(n, 4))
    elif spec == "bitpack":
        # the traffic table's data (traffic_report.cc): indices below 4096, 12 bits each
        s.update(groups=ceil_div(n, 32), bits=12)
    return s


@dataclass
class Op:
    """One operation of an encode or decode on the device, and its predicted time."""
    name: str
    launches: int
    dram_bytes: float       # per input byte, from the traffic table
    asked: float = 0.0      # bytes the kernel's loads and stores ask for, per input byte
    kernel: str = ""        # the SASS kernel ("" for copies and memsets)
    seconds: float = 0.0    # the prediction
    bound: float = 0.0      # the largest of the three bounds, as a time (plus the launch)
    bounds: dict = field(default_factory=dict)   # dram, issue, latency (seconds)
    facts: dict = field(default_factory=dict)    # what the SASS says (the table's inputs)
    note: str = ""


def read_traffic(path):
    with open(path) as f:
        lines = [l for l in f if not l.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def sync_ops(rows, phase):
    """The operations actpack.encode / actpack.decode run (codecs::Encode; Verify then
    DecodeVerified), from the traffic table's rows of the deferred path: an encode adds the
    counters' memset and the status read back; a decode verifies the checksum on its own (a
    memset, the checksum, a read back), then decodes (a memset, the kernels, a read back of
    the failures), and reads the header first; it has no CheckHeaderKernel nor PoisonKernel.
    A codec that checks its buffer in its decode launch decodes as below (checks_own)."""
    # A codec whose decode launch checks the buffer itself (ChecksOwnBuffer: no ChecksumKernel
    # nor CheckHeaderKernel on its deferred path) decodes synchronously in that launch: the
    # header read, the counters' memset, its kernels, the failures read back (Poison only for a
    # buffer flagged unrepresentable).
    checks_own = phase == "decode" and not any(
        r["kernel"].startswith(("ChecksumKernel", "CheckHeaderKernel")) for r in rows)
    ops = []
    for r in rows:
        if r["kernel"] == "(all)":
            continue
        if phase == "decode" and r["kernel"].startswith(("CheckHeaderKernel", "PoisonKernel")):
            continue
        ops.append(Op(r["kernel"], int(r["launches"]), float(r["dram_per_input_byte"]),
                      asked=float(r["bytes_per_input_byte"] or 0)))
    small = ["cudaMemsetAsync (counters)", "cudaMemcpyAsync (status to host)"]
    if checks_own:
        small = ["cudaMemcpyAsync (header to host)", "cudaMemsetAsync (counters)",
                 "cudaMemcpyAsync (failures to host)"]
    elif phase == "decode":
        small = ["cudaMemcpyAsync (header to host)", "cudaMemsetAsync (counters)",
                 "cudaMemcpyAsync (sum to host)", "cudaMemsetAsync (counters)",
                 "cudaMemcpyAsync (failures to host)"]
    return ops + [Op(name, 1, 0.0) for name in small]


def occupancy(kernel, threads):
    """Resident blocks per SM (registers, shared memory, threads, the block limit)."""
    warps = ceil_div(threads, 32)
    per_warp = ceil_div(max(kernel.registers, 1) * 32, REGISTER_UNIT) * REGISTER_UNIT
    by_registers = (REGISTERS_PER_SM // per_warp) // warps
    by_shared = SHARED_PER_SM // (kernel.shared + SHARED_RESERVED_PER_BLOCK)
    return max(1, min(BLOCKS_PER_SM, WARPS_PER_SM // warps, by_registers, by_shared))


def sass_kernel(kernels, name, dtype):
    """The SASS kernel of a traffic-table kernel name (template argument from the dtype)."""
    base = name.split("<")[0]
    arg = name[len(base):].strip("<>")
    if arg.isdigit():
        return kernels.get(f"{base}<{arg}>")
    if arg == "Width":  # a kernel templated on the element's bytes (mask's)
        width = {"float32": 4, "float16": 2, "bfloat16": 2, "bool": 1}[dtype]
        return kernels.get(f"{base}<{width}>")
    if arg:
        k = K_OF_DTYPE.get(dtype, 5)  # bitpack's int64 is its kind 5
        return kernels.get(f"{base}<{k}>")
    return kernels.get(base)


def lines_of(tree, places):
    """[(file, line)] of the lines of `places` ((file, text)) in the tree; none where a file
    or a text is not there."""
    found = []
    for path, text in places:
        try:
            with open(os.path.join(tree, path)) as f:
                found += [(path, k + 1) for k, t in enumerate(f.read().splitlines()) if text in t]
        except OSError:
            pass
    return found


def resolve_trips(kernel, launch, tree, shape):
    """[(Trip, header, Body, unrolling)]: each source loop's SASS loop (of its versions, the
    most unrolled that can run, then the costliest); and the SASS loops with global accesses
    that no Trip names."""
    found, named = [], set()
    code = {loc for b in kernel.f.blocks for i in b for loc in i.chain}
    for trip in launch.trips:
        path = os.path.join(tree, trip.file or launch.file)
        with open(path) as f:  # the lines with the anchor that this kernel's code comes from
            lines = [k + 1 for k, text in enumerate(f.read().splitlines()) if trip.anchor in text
                     and any(p.endswith(trip.file or launch.file) and l == k + 1 for p, l in code)]
        if len(lines) < trip.nth:
            raise SystemExit(f"kernel_model: {kernel.name}: no line '{trip.anchor}' "
                             f"(#{trip.nth}) in {trip.file or launch.file}: update work()")
        line = lines[trip.nth - 1]
        cold = []
        for cold_file, text in (trip.cold(shape) if callable(trip.cold) else trip.cold):
            with open(os.path.join(tree, cold_file)) as f:
                cold += [(cold_file, k + 1) for k, t in enumerate(f.read().splitlines())
                         if text in t]
        suffix = trip.file or launch.file
        versions = [h for h, _ in kernel.loops()
                    if (lambda p, l: p.endswith(suffix) and l == line)(*kernel.closing_line(h))]
        named.update(versions)
        if not versions:
            continue  # unrolled into its enclosing loop, or never compiled for this kernel
        best = None
        for h in versions:
            b = kernel.body(h, cold)
            unroll = len(b.loads) / trip.loads if trip.loads else 1
            if trip.per_entry and unroll > trip.per_entry:
                continue
            key = (unroll, b.issue_cycles() / max(unroll, 1))
            if best is None or key > best[0]:
                best = (key, h, b, max(unroll, 1))
        if best:
            found.append((trip, best[1], best[2], best[3]))
    unnamed = [h for h, _ in kernel.loops() if h not in named and
               (kernel.body(h).loads or kernel.body(h).stores)]
    return found, unnamed


def predict_op(op, kernels, works, dtype, shape, tree):
    """Fills op.seconds, op.bounds and op.facts."""
    n = shape["input_bytes"]
    dram = op.dram_bytes * n
    t_dram = dram / (DRAM_FRACTION * DRAM_PEAK)
    if not op.name.endswith("Kernel") and "Kernel<" not in op.name:
        op.bounds = {"dram": t_dram, "issue": 0.0, "latency": 0.0}
        op.seconds = op.bound = op.launches * LAUNCH_S + t_dram
        return
    kernel = sass_kernel(kernels, op.name, dtype)
    base = op.name.split("<")[0]
    if kernel is None or base not in works:
        raise SystemExit(f"kernel_model: no SASS or no work() entry for {op.name}")
    op.kernel = kernel.name
    launch = works[base]
    s = dict(shape, bytes=dram)  # a checksum's bytes are the payload it reads
    threads, blocks = launch.threads, launch.blocks(s)
    warps_per_block = ceil_div(threads, 32)
    resident_blocks = occupancy(kernel, threads)
    sms = min(SMS, blocks)
    warps_per_sm = min(resident_blocks, ceil_div(blocks, sms)) * warps_per_block
    chip_warps = warps_per_sm * sms
    width = min(ISSUE_PER_SM, warps_per_sm)
    found, unnamed = resolve_trips(kernel, launch, tree, s)
    outside = kernel.outside(lines_of(tree, CLOSING))
    grid_warps = blocks * warps_per_block
    # A stall waits a DRAM latency for the share of the bytes asked for that DRAM supplies
    # (the traffic table's unique sectors over the bytes requested), an L1 hit for the rest.
    miss = min(1.0, op.dram_bytes / op.asked) if op.asked else 1.0
    latency = miss * DRAM_LATENCY_S + (1 - miss) * L1_LATENCY_S
    issue = grid_warps * outside.issue_cycles(width)
    exposed = grid_warps * outside.exposures * latency
    stalled = grid_warps * outside.stalls / CLOCK_HZ
    totals = {"instr": grid_warps * len(outside.instrs), "wide64": grid_warps * outside.wide64,
              "div": grid_warps * outside.divisions, "cvt": grid_warps * outside.conversions}
    heaviest = None
    for trip, header, body, unroll in found:
        iterations = trip.iterations(s) / unroll
        issue += iterations * body.issue_cycles(width)
        exposed += iterations * body.exposures * latency
        stalled += iterations * body.stalls / CLOCK_HZ
        totals["instr"] += iterations * len(body.instrs)
        totals["wide64"] += iterations * body.wide64
        totals["div"] += iterations * body.divisions
        totals["cvt"] += iterations * body.conversions
        moved = iterations * len(body.loads)
        if body.loads and (heaviest is None or moved > heaviest[0]):
            heaviest = (moved, body, unroll)
    t_issue = issue / (sms * CLOCK_HZ)
    t_exposed, t_stalled = exposed / chip_warps, stalled / chip_warps
    op.bounds = {"dram": t_dram, "issue": t_issue, "latency": t_exposed + t_stalled}
    op.bound = op.launches * (LAUNCH_S + max(op.bounds.values()))
    # The prediction: a warp issues nothing while it waits, and the resident warps, started
    # together on the same code, wait together; so the exposed latency adds to the issue time
    # (or to the warps' own stall chains, if longer), up to the DRAM roofline.
    op.seconds = op.launches * (LAUNCH_S + max(t_dram, t_exposed + max(t_issue, t_stalled)))
    elements = shape["numel"]
    body = heaviest[1] if heaviest else outside
    op.facts = {
        "issue_per_elem": totals["instr"] / elements, "int64_per_elem": totals["wide64"] / elements,
        "div_per_elem": totals["div"] / elements, "cvt_per_elem": totals["cvt"] / elements,
        "loads": widths(body.loads), "stores": widths(body.stores),
        "in_flight": body.in_flight, "unroll": heaviest[2] if heaviest else 1,
        "warps_per_sm": warps_per_sm, "registers": kernel.registers, "threads": threads}
    if unnamed:
        op.note = "loops not modeled: " + ", ".join(hex(kernel.f.blocks[h][0].addr)
                                                     for h in unnamed)


def widths(ops):
    """'4Bx2 16Bx1': global accesses of a loop by bytes per thread."""
    count = {}
    for o in ops:
        count[access_bytes(o)] = count.get(access_bytes(o), 0) + 1
    return " ".join(f"{b}Bx{c}" for b, c in sorted(count.items())) or "-"


def copy_seconds(nbytes):
    """A device-to-device copy of the input: one launch, DRAM reads and writes every byte."""
    return LAUNCH_S + 2 * nbytes / (DRAM_FRACTION * DRAM_PEAK)


def read_benchmark(path):
    """{(spec, MiB): {'enc': kern enc, 'dec': kern dec, 'ratio': ratio}} of the H100 run."""
    found = {}
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            cells = line.split()  # codec size copy enc dec enc/copy dec/copy e+d ratio kern...
            if len(cells) == 13 and cells[1].endswith("MiB"):
                found[(cells[0], int(cells[1][:-3]))] = {
                    "ratio": float(cells[8]), "encode": float(cells[9]), "decode": float(cells[10])}
    return found


BENCHMARKED = ["identity", "quant2", "quant4", "quant8", "eb:rel=1e-2", "eb:rel=1e-3", "division"]
OTHERS = [("cast", "float32"), ("mask", "bool"), ("pool", "float32"), ("bitpack", "int64"),
          ("division_dct", "float32")]
SIZES_MIB = [64, 256]
COLUMNS = ["codec", "size", "phase", "op", "launches", "kernel", "threads", "registers",
           "warps_per_sm", "issue_per_elem", "int64_per_elem", "div_per_elem", "cvt_per_elem",
           "loads", "stores", "unroll", "in_flight", "dram_per_input_byte", "dram_us", "issue_us",
           "latency_us", "bound", "bound_fraction", "predicted_us", "fraction_of_copy",
           "measured", "predicted_over_measured", "note"]


def model(tree, traffic_path, benchmark, measured_column):
    """The table rows for the kernels of `tree` (a checkout's root). The benchmark gives eb's
    compression ratio (data, not speed) and, with `measured_column`, the measured fractions."""
    sources = sorted(os.path.join(tree, "codecs", "cuda", f)
                     for f in os.listdir(os.path.join(tree, "codecs", "cuda")) if f.endswith(".cu"))
    kernels = analyse_sources(sources, tree, tree)
    works = work(tree)
    traffic = read_traffic(traffic_path)
    rows = []
    cases = [(spec, "float32") for spec in BENCHMARKED] + ([] if measured_column else OTHERS)
    for spec, dtype in cases:
        codec = spec.split(":")[0]
        for mib in SIZES_MIB:
            nbytes = mib << 20
            measured = benchmark.get((spec, mib), {})
            shape = shape_of(spec, dtype, nbytes, measured.get("ratio", 1.0))
            if not measured_column:
                measured = {}
            copy = copy_seconds(nbytes)
            for phase in ("encode", "decode"):
                phase_rows = [r for r in traffic if r["codec"] == codec and r["dtype"] == dtype
                              and r["phase"] == phase]
                ops = sync_ops(phase_rows, phase)
                for op in ops:
                    predict_op(op, kernels, works, dtype, shape, tree)
                total = sum(op.seconds for op in ops)
                bound = sum(op.bound for op in ops)
                for op in ops:
                    rows.append(row(f"{spec} {dtype}", mib, phase, op, copy))
                rows.append({"codec": f"{spec} {dtype}", "size": f"{mib}MiB", "phase": phase,
                             "op": "(all)", "launches": str(sum(op.launches for op in ops)),
                             "bound_fraction": f"{copy / bound:.3f}",
                             "predicted_us": f"{total * 1e6:.1f}",
                             "fraction_of_copy": f"{copy / total:.3f}",
                             "measured": f"{measured[phase]:.2f}" if phase in measured else "",
                             "predicted_over_measured": (f"{copy / total / measured[phase]:.2f}"
                                                         if phase in measured else "")})
    return rows


def row(spec, mib, phase, op, copy):
    b = op.bounds
    bound = max(b, key=b.get) if any(b.values()) else "launch"
    r = {"codec": spec, "size": f"{mib}MiB", "phase": phase, "op": op.name,
         "launches": str(op.launches), "kernel": op.kernel,
         "dram_per_input_byte": f"{op.dram_bytes:.4f}",
         "dram_us": f"{b['dram'] * 1e6:.1f}", "issue_us": f"{b['issue'] * 1e6:.1f}",
         "latency_us": f"{b['latency'] * 1e6:.1f}", "bound": bound,
         "bound_fraction": f"{copy / op.bound:.3f}",
         "predicted_us": f"{op.seconds * 1e6:.1f}", "fraction_of_copy": f"{copy / op.seconds:.3f}",
         "note": op.note}
    f = op.facts
    if f:
        r.update({"threads": str(f["threads"]), "registers": str(f["registers"]),
                  "warps_per_sm": str(f["warps_per_sm"]),
                  "issue_per_elem": f"{f['issue_per_elem']:.3f}",
                  "int64_per_elem": f"{f['int64_per_elem']:.3f}",
                  "div_per_elem": f"{f['div_per_elem']:.4f}",
                  "cvt_per_elem": f"{f['cvt_per_elem']:.3f}",
                  "loads": f["loads"], "stores": f["stores"], "unroll": f"{f['unroll']:g}",
                  "in_flight": str(f["in_flight"])})
    return r


def render(rows, title):
    out = io.StringIO()
    out.write(f"# {title}\n")
    out.write("\t".join(COLUMNS) + "\n")
    for r in rows:
        out.write("\t".join(r.get(c, "") for c in COLUMNS) + "\n")
    return out.getvalue()


def tree_at(commit, scratch):
    """codecs/ (kernels and traffic table), common/ and the build's flags at a commit, unpacked
    under `scratch` (needs the commit in this clone's history)."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "codecs", "common",
                              "third_party/actpack.bzl"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(scratch, filter="data")
    return scratch


def summary(rows):
    """The (all) rows: predicted fraction of a copy (and the bound's), and the measured one."""
    lines = [f"{'codec':<21} {'size':>6}  {'encode: predicted bound measured':>32}  "
             f"{'decode: predicted bound measured':>32}"]
    totals = {(r["codec"], r["size"], r["phase"]): r for r in rows if r["op"] == "(all)"}
    for (codec, size, phase), r in totals.items():
        if phase != "encode":
            continue
        cells = []
        for x in (r, totals[(codec, size, "decode")]):
            ratio = f"({x['predicted_over_measured']}x)" if x["measured"] else ""
            cells.append(f"{x['fraction_of_copy']:>9} {x['bound_fraction']:>6} "
                         f"{x['measured'] or '-':>5} {ratio:>8}")
        lines.append(f"{codec:<21} {size:>6}  {cells[0]:>32}  {cells[1]:>32}")
    return "\n".join(lines)


def worst_ratio(rows):
    ratios = [float(r["fraction_of_copy"]) / float(r["measured"])
              for r in rows if r["op"] == "(all)" and r["measured"]]
    return max(max(ratios), 1 / min(ratios)) if ratios else None


def read_rows(path):
    with open(path) as f:
        lines = [l for l in f if not l.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def check(rows, path):
    """Problems: a row whose predicted fraction fell more than TOLERANCE below the table's, or
    a row added or gone. A rise passes (and is reported: the table is stale)."""
    committed = {(r["codec"], r["size"], r["phase"], r["op"]): r for r in read_rows(path)}
    now = {(r["codec"], r["size"], r["phase"], r["op"]): r for r in rows}
    problems, rises = [], []
    for key in sorted(set(committed) | set(now)):
        c, n = committed.get(key), now.get(key)
        if c is None or n is None:
            problems.append(f"{' '.join(key)}: {'not in the table' if c is None else 'gone'}")
            continue
        was, new = float(c["fraction_of_copy"]), float(n["fraction_of_copy"])
        if new < was - TOLERANCE:
            problems.append(f"{' '.join(key)}: predicted fraction of a copy {was:.3f} -> {new:.3f}")
        elif new > was + TOLERANCE:
            rises.append(f"{' '.join(key)}: {was:.3f} -> {new:.3f}")
    return problems, rises


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite both tables")
    parser.add_argument("--check", action="store_true", help="HEAD's kernels against model.tsv")
    parser.add_argument("--measured", action="store_true",
                        help="print the 2026-11-27 kernels against their measurements")
    parser.add_argument("--loops", nargs="+", metavar="FILE.cu", help="print every loop (JSON)")
    parser.add_argument("--include", default=ROOT, help="include directory for --loops")
    args = parser.parse_args()
    if not os.access(NVCC, os.X_OK):
        print(f"kernel_model: skipped: no nvcc at {NVCC}")
        return 0
    if args.loops:
        kernels = analyse_sources([os.path.abspath(s) for s in args.loops], args.include)
        print(json.dumps(loop_report(kernels), indent=1))
        return 0
    benchmark = read_benchmark(BENCHMARK)
    if args.measured or args.update:
        scratch = tempfile.mkdtemp(prefix="kernel_model_tree.")
        try:
            tree = tree_at(MEASURED_COMMIT, scratch)
            measured_rows = model(tree, os.path.join(tree, TRAFFIC), benchmark, True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"The kernels of {MEASURED_COMMIT} (measured on the H100, {BENCHMARK}): "
              "predicted and measured kernel time as a fraction of a copy")
        print(summary(measured_rows))
        print(f"worst ratio predicted/measured (either way): {worst_ratio(measured_rows):.2f}")
        if args.update:
            with open(os.path.join(ROOT, MEASURED_TABLE), "w") as f:
                f.write(render(measured_rows, f"tools/kernel_model.py --update: the kernels of "
                               f"{MEASURED_COMMIT} on an H100, against {BENCHMARK}"))
        if not args.update:
            return 0
    rows = model(ROOT, os.path.join(ROOT, TRAFFIC), benchmark, False)
    if args.update:
        with open(os.path.join(ROOT, TABLE), "w") as f:
            f.write(render(rows, "tools/kernel_model.py --update: HEAD's kernels on an H100"))
        print(f"kernel_model: wrote {TABLE} and {MEASURED_TABLE}")
        return 0
    if args.check:
        problems, rises = check(rows, os.path.join(ROOT, TABLE))
        for r in rises:
            print(f"kernel_model: faster than {TABLE} says (run --update): {r}")
        if problems:
            print(f"kernel_model: FAILED: the model of HEAD's kernels differs from {TABLE}:")
            for p in problems:
                print("  " + p)
            print("If the change is intended, run python3 tools/kernel_model.py --update and "
                  "commit the tables with the kernels.")
            return 1
        print(f"kernel_model: {len(rows)} rows at or above {TABLE} (tolerance {TOLERANCE})")
        return 0
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
