"""Where the linear backward's time should go, without a GPU: every launch of the Mamba-2 and GLA backward at
the training table's shapes, compiled for sm_90a (registers, spills, tensor-core and FMA instructions), with its
grid, sequential loop, HBM bytes and matmul FLOPs counted from the code, and a lower bound on an H100.

    python scripts/linear_bwd_compile.py            # both tables; exits 1 if ptxas spills anywhere
    python scripts/linear_bwd_compile.py --no-compile   # the byte / FLOP table only
    python scripts/linear_bwd_compile.py --only dqk     # every table, the dq/dk launches alone compiled

Shapes (bf16, B = 1, T = 16K, chunks of 64): Mamba-2 as `mamba2.bench.TRAIN` calls it (80 heads x headdim 64,
dstate 128, one group, z, D [H], dt_bias, softplus; the ungated output for dz taken from the forward, so no
output launch); GLA as `gla.bench.TRAIN` (32 heads, K = V = 128, gk bf16); and KDA's own backward kernels
(attention_kernels/kda/chunk_backward.py) at GLA's shape, with the L2 norm in the kernel and g fp32.
Each kernel is compiled in every config of its autotune list (the others at Triton's defaults, 4 warps and 3
stages), with the pointers marked 16-divisible as contiguous tensors' are at launch. Instruction counts are from
the SASS (cuobjdump): HGMMA (wgmma), HMMA (mma.sync), FFMA (fp32 FMA: elementwise code and any IEEE dot).

Bytes count what the code asks of memory: each tensor a program loads, once per program that loads it (a tensor
re-read by the programs of other tiles is counted each time, marked "xN"; some of those re-reads hit L2), and
every store. The bound is max(bytes / 3.35 TB/s, FLOPs / rate), the rate that of the units the products run on:
~990 TFLOP/s dense bf16, ~495 tf32, ~67 fp32 FMA. A sequential pass (loop over the chunks in each program) is
also bounded by its steps: 256 dependent steps of one product each, ~1 us a step at best when a program's step
cannot overlap with the next one's loads.
"""
import argparse
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (attention_kernels/__init__ would pick the interpreter)

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner

from attention_kernels.gla import chunk as gla_chunk
from attention_kernels.kda import chunk as kda_chunk
from attention_kernels.kda import chunk_backward as kda_bw
from attention_kernels.linear import chunk as lin
from attention_kernels.linear import chunk_backward as lbw
from attention_kernels.mamba2 import chunk as ssd

TARGET = GPUTarget("cuda", 90, 32)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
HBM, TC_BF16, TC_TF32, FMA32 = 3.35e12, 990e12, 495e12, 67e12
MUFU = 132 * 16 * 1.755e9     # exponentials a second: 16 a clock per SM
MB = 1e6
# the backward's chunk-start states and their gradients ([NT, H, K, V] each): their dtype for bf16 inputs,
# as a kernel argument type and in bytes an element
STATE_DTYPE = lin.chunk_state_dtype(torch.bfloat16)
STATE_PTR = "*" + {torch.bfloat16: "bf16", torch.float32: "fp32"}[STATE_DTYPE]
STATE_BYTES = STATE_DTYPE.itemsize
L = lin.CHUNK
T = 16384
NT = T // L


@dataclass
class Launch:
    """One launch of a backward: what it is, its grid and loop, its bytes and FLOPs, and how to compile it."""
    name: str
    fn: object                      # JITFunction or Autotuner
    types: dict                     # non-constexpr arguments: "*bf16", "fp32", "i32"
    consts: dict                    # constexprs (the others at their defaults)
    programs: int
    loop: str                       # the sequential loop of one program
    read_mb: float
    write_mb: float
    gflop: float = 0.0
    units: str = "-"                # what the products run on: "bf16 TC", "fp32 FMA", ...
    note: str = ""
    configs: list = field(default_factory=list)   # (kwargs, warps, stages); empty: the autotuner's list

    def bound_ms(self) -> float:
        rates = {"bf16 TC": TC_BF16, "tf32 TC": TC_TF32, "fp32 FMA": FMA32, "exp": MUFU}
        compute = self.gflop / rates.get(self.units, TC_BF16) + sum(g / rates[u] for u, g in self.side.items())
        return 1e3 * max((self.read_mb + self.write_mb) * MB / HBM, compute * 1e9)

    side: dict = field(default_factory=dict)      # other work: units -> G operations (FLOPs, or exponentials)
    reread_mb: float = 0.0                        # the part of read_mb that re-reads what another tile read

    def bound_l2_ms(self) -> float:
        """The bound with every re-read served by L2."""
        return max(self.bound_ms() - 1e3 * self.reread_mb * MB / HBM, 1e3 * (self.read_mb + self.write_mb
                   - self.reread_mb) * MB / HBM)


def _configs(launch: Launch):
    if launch.configs:
        return launch.configs
    if hasattr(launch.fn, "configs"):
        return [(c.kwargs, c.num_warps, c.num_stages) for c in launch.fn.configs]
    return [({}, 4, 3)]


def compile_launch(launch: Launch, kwargs: dict, warps: int, stages: int):
    fn = launch.fn.fn if isinstance(launch.fn, Autotuner) else launch.fn
    # a config's kwarg that names a typed argument gives that argument another type (W's fp32 partials);
    # maxnreg is ptxas's register cap
    options = {"num_warps": warps, "num_stages": stages}
    if "maxnreg" in kwargs:
        options["maxnreg"] = kwargs["maxnreg"]
    types = dict(launch.types, **{k: v for k, v in kwargs.items() if k in launch.types})
    consts = dict(launch.consts, **{k: v for k, v in kwargs.items() if k not in launch.types and k != "maxnreg"})
    signature, constants = {}, {}
    for p in fn.params:
        if p.name in types:
            signature[p.name] = types[p.name]
        else:
            value = consts[p.name] if p.name in consts else p.default
            signature[p.name] = "constexpr"
            constants[p.name] = value
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in types.items() if t.startswith("*")}
    return triton.compile(ASTSource(fn, signature, constants, attrs), target=TARGET, options=options)


def inspect_binary(compiled) -> dict:
    """ptxas's registers and spills, and the SASS's tensor-core and FMA instruction counts."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(compiled.asm["ptx"])
        done = subprocess.run([str(BIN / "ptxas"), "-arch=sm_90a", "-v", str(ptx), "-o", str(cubin)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"ptxas failed:\n{done.stdout}{done.stderr}")
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
    log = done.stdout + done.stderr
    stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    return dict(regs=int(re.search(r"Used (\d+) registers", log).group(1)), spill=stores + loads,
                hgmma=len(re.findall(r"\bHGMMA\.", sass)), hmma=len(re.findall(r"\bHMMA\.", sass)),
                ffma=len(re.findall(r"\bFFMA\b", sass)), smem=compiled.metadata.shared,
                # what cross-warp reductions, scans and layout changes cost: barriers and shared-memory traffic
                bar=len(re.findall(r"\bBAR\.SYNC", sass)), sts=len(re.findall(r"\bSTS\b", sass)),
                lds=len(re.findall(r"\bLDS(?:M)?\b", sass)), shfl=len(re.findall(r"\bSHFL\.", sass)))


# ------------------------------------------------------------------ the launches
def mamba2_backward() -> list:
    H, P, N = 80, 64, 128
    thp = T * H * P / MB            # elements of a [T, H, P] tensor, in millions
    thn = T * H * N / MB
    th = T * H / MB
    states = NT * H * N * P / MB    # elements of [NT, H, N, P]
    bf, f4, sb = 2, 4, STATE_BYTES
    gemm = 2 * T * H * N * P / 1e9  # one [T, N] x [N, P] product per head: 21.5 GFLOP
    nk, runs = N // ssd._DQK_BK, -(-H // ssd._DQK_HEADS)
    w_mb = runs * T * L * bf / MB        # W, [runs, NT, 64, 64] in B's dtype
    i32 = {n: "i32" for n in ("T", "H", "NT", "NBH", "HPG", "G", "HP", "NTB", "P")}
    scalars = dict(dt="*fp32", g="*fp32", b="*fp32", **{k: "i32" for k in ("T", "H", "NT", "HPG", "G", "NB")})
    dims = dict(N=N, P=P, L=L, BT=L)
    return [
        Launch("ssd_gates", ssd._ssd_gates_kernel,
               dict(dt="*bf16", dt_bias="*fp32", A="*fp32", dtf="*fp32", b="*fp32", T="i32", H="i32", s_db="i32",
                    s_dt="i32", s_dh="i32", s_bias="i32", s_A="i32"),
               dict(HAS_BIAS=True, SOFTPLUS=True, FLOOR=lin.GATE_FLOOR, BT=L, BH=64),
               NT * 2, "-", th * bf, 2 * th * f4),
        Launch(f"ssd_state_pass ({STATE_PTR[1:]} states)", ssd._ssd_state_kernel,
               dict(B="*bf16", x="*bf16", dt="*fp32", b="*fp32", h=STATE_PTR, **{k: i32[k] for k in
                    ("T", "H", "NT", "NBH", "HPG", "G")}),
               dict(dims, USE_H0=False, STORE_HT=False, DOT_PREC="tf32", h0=None, ht=None),
               H * N // 32, "256 chunks", thp * bf * N / 32 + 2 * th * f4 * N / 32, states * sb, gemm, "bf16 TC",
               "x read once per dstate tile (x4 at BK 32, x2 at 64); 160-320 programs, 256 dependent steps",
               reread_mb=3 * thp * bf),
        Launch("gate grad (dz, do, dD)", ssd._ssd_gate_grad_kernel,
               dict(dy="*bf16", z="*bf16", y_ungated="*bf16", x="*bf16", do="*bf16", dz="*bf16", dD_part="*fp32",
                    T="i32", HP="i32", NTB="i32"),
               dict(HAS_Z=True, HAS_D=True, BT=16, BC=128), T // 16 * H * P // 128, "-", 4 * thp * bf,
               2 * thp * bf + T / 16 * H * P * f4 / MB, configs=[({}, ssd._TAIL_WARPS, 3)]),
        Launch("chunk_state_grad_pass (q = C per group)", lbw._chunk_state_grad_kernel,
               dict(q="*bf16", do="*bf16", b="*fp32", dh=STATE_PTR, scale="fp32", T="i32", H="i32", NT="i32", NBH="i32",
                    GROUP="i32"),
               dict(K=N, V=P, G=1, BT=L, USE_DHT=False, STORE_DH0=False, DOT_PREC="tf32", dht=None, dh0=None),
               2 * 2 * H, "256 chunks", thn * bf * 2 + thp * bf * 2 + th * f4 * 4, states * sb, gemm, "bf16 TC",
               "C (4 MB) read per head and value tile from L2, do x2 (key tiles); 160-640 programs (autotuned), "
               "256 dependent steps", reread_mb=thn * bf * 2 - T * N * bf / MB + thp * bf),
        Launch("chunk_dv (scores recomputed; C, B per group; dx = dv + do D)", lbw._chunk_dv_kernel,
               dict(q="*bf16", k="*bf16", v="*bf16", b="*fp32", dh=STATE_PTR, do="*bf16", dv="*bf16", dA="*fp32",
                    scale="fp32", T="i32", H="i32", NT="i32", key_scale="*fp32", GROUP="i32", skip="*fp32",
                    s_skip_v="i32"),
               dict(K=N, V=P, G=1, BT=L, BK=64, BV=64, DOT_PREC="tf32", RECOMPUTE_A=True, A=None, KEY_SCALE=True,
                    s_skip_h=1, SKIP=True),
               NT * H, "-", 2 * thn * bf + 2 * thp * bf + states * sb + 2 * th * f4 + H * f4 / MB,
               thp * bf + T * H * L * f4 / MB, 3 * gemm, "bf16 TC",
               "C and B (4 MB each) read once per head from L2, to the tensor cores as loaded (dt and the decay "
               "scale rows of fp32 products); the skip's do D added in fp32, dv written as dx (bf16); dA fp32 "
               "[T, H, 64]",
               reread_mb=2 * thn * bf - 2 * T * N * bf / MB),
        Launch("ssd dqk intra (once per chunk and head)", ssd._ssd_dqk_intra_kernel,
               dict(C="*bf16", B="*bf16", dA="*fp32", W="*bf16", dg_intra="*fp32", ddt_intra="*fp32", **scalars),
               dict(N=N, BT=L, BK=ssd._DQK_INTRA_BK, HEADS=ssd._DQK_HEADS, FLOOR=lin.GATE_FLOOR, DOT_PREC="tf32"),
               NT * runs, f"{ssd._DQK_HEADS} heads",
               2 * runs * T * N * bf / MB + T * H * L * f4 / MB + 3 * th * f4, w_mb + 2 * th * f4,
               2 * T * L * N * runs / 1e9, "bf16 TC",
               "C B^T over the whole dstate once a run; per head D, W, E, R and their sums once (not once per key "
               "tile); W written rounded to bf16",
               # as launched, then on 8 warps (slower on the H200: 662 µs against 434 at 16K)
               configs=[({}, ssd._DQK_INTRA_WARPS, ssd._DQK_INTRA_STAGES), ({}, 8, ssd._DQK_INTRA_STAGES)]),
        Launch("ssd dqk key tiles (on W)", ssd._ssd_dqk_kernel,
               dict(C="*bf16", B="*bf16", x="*bf16", h=STATE_PTR, dh=STATE_PTR, do="*bf16", W="*bf16",
                    dC_part="*fp32", dB_part="*fp32", dg_tiles="*fp32", ddt_tiles="*fp32", **scalars),
               dict(N=N, P=P, BT=L, BK=ssd._DQK_BK, BV=ssd._DQK_BV, HEADS=ssd._DQK_HEADS, FLOOR=lin.GATE_FLOOR,
                    DOT_PREC="tf32"),
               nk * NT * runs, f"{ssd._DQK_HEADS} heads",
               2 * states * sb + nk * (2 * thp * bf + 3 * th * f4 + w_mb) + 2 * runs * T * N * bf / MB,
               2 * runs * T * N * f4 / MB + 2 * nk * th * f4, 2 * gemm + 4 * T * L * N * runs / 1e9, "bf16 TC",
               "two products a head (the inter-chunk ones), W B and W^T C once a run; x, do and W read once per "
               f"dstate tile (x{nk}: the {nk} programs of a chunk run side by side, so mostly from L2); dC, dB as "
               "partial sums per run of heads; dt, g, b read and the gate's and dt's inter shares written "
               "head-major ([H, T]: 256 contiguous bytes a head and chunk)",
               configs=[({}, ssd._DQK_WARPS, ssd._DQK_STAGES)],
               reread_mb=(nk - 1) * (2 * thp * bf + w_mb)),
    ]


def gla_backward() -> list:
    H, K, V = 32, 128, 128
    thk = T * H * K / MB
    states = NT * H * K * V / MB
    bf, f4, sb = 2, 4, STATE_BYTES
    gemm = 2 * T * H * K * V / 1e9  # one [T, K] x [K, V] product per head: 17.2 GFLOP
    ints = {n: "i32" for n in ("T", "H", "NT", "NBH")}
    tri = 2 * 2 * L * L * 64 * 2 * NT * H / 1e9          # chunk_dqk's two [64, 64] x [64, 64] triangle sums
    return [
        Launch("chunk_local_cumsum", lin._chunk_local_cumsum_kernel,
               dict(g="*bf16", b="*fp32", T="i32", H="i32"), dict(G=K, FLOOR=lin.GATE_FLOOR, BT=L, BG=64),
               2 * NT * H, "-", thk * bf, thk * f4),
        Launch(f"chunk_state_pass ({STATE_PTR[1:]} states)", lin._chunk_state_kernel,
               dict(k="*bf16", v="*bf16", b="*fp32", h=STATE_PTR, **ints),
               dict(K=K, V=V, G=K, BT=L, USE_H0=False, STORE_HT=False, DOT_PREC="tf32", h0=None, ht=None),
               2 * 4 * H, "256 chunks", thk * bf * 4 + thk * bf * 2 + thk * f4 * 4, states * sb, gemm, "bf16 TC",
               "k and b re-read per value tile (x4 at BV 32), v per key tile (x2); 256 programs",
               reread_mb=3 * thk * bf + 3 * thk * f4 + thk * bf),
        Launch("chunk_gla_scores", gla_chunk._chunk_gla_scores_kernel,
               dict(q="*bf16", k="*bf16", g="*fp32", A="*bf16", scale="fp32", T="i32", H="i32"),
               dict(K=K, BT=L, BC=16, BK=128, DOT_PREC="tf32"),
               4 * NT * H, "<= 3 sub-chunks", 2 * thk * bf + 2 * thk * f4, T * H * L * bf / MB,
               1.5 * 2 * T * 16 * K * H / 1e9, "bf16 TC",
               "the 16 x 16 diagonal blocks elementwise, an exp per key channel and pair: 1.2 G exp",
               side={"fp32 FMA": 2 * T * 16 * K * H / 1e9, "exp": 1.24}),
        Launch("chunk_state_grad_pass", lbw._chunk_state_grad_kernel,
               dict(q="*bf16", do="*bf16", b="*fp32", dh=STATE_PTR, scale="fp32", **ints),
               dict(K=K, V=V, G=K, BT=L, USE_DHT=False, STORE_DH0=False, DOT_PREC="tf32", dht=None, dh0=None),
               2 * 4 * H, "256 chunks", thk * bf * 4 + thk * bf * 2 + thk * f4 * 4, states * sb, gemm, "bf16 TC",
               "q and b re-read per value tile (x4), do per key tile (x2); 256 programs",
               reread_mb=3 * thk * bf + 3 * thk * f4 + thk * bf),
        Launch("chunk_dv", lbw._chunk_dv_kernel,
               dict(q="*bf16", k="*bf16", v="*bf16", b="*fp32", A="*bf16", dh=STATE_PTR, do="*bf16", dv="*bf16",
                    dA="*fp32", scale="fp32", T="i32", H="i32", NT="i32"),
               dict(K=K, V=V, G=K, BT=L, BK=64, BV=64, DOT_PREC="tf32", RECOMPUTE_A=False),
               NT * H, "-", T * H * L * bf / MB + 2 * thk * bf + 2 * thk * f4 + states * sb + 2 * thk * bf,
               thk * bf + T * H * L * f4 / MB, gemm + 2 * 2 * T * L * V * H / 1e9, "bf16 TC",
               "k and b read once per value tile (x2)", configs=[({}, 4, 2)], reread_mb=thk * bf + thk * f4),
        Launch("chunk_dqk intra (sub-chunks)", lbw._chunk_dqk_intra_kernel,
               dict(q="*bf16", k="*bf16", b="*fp32", dA="*fp32", dq="*fp32", dk="*fp32", T="i32", H="i32"),
               dict(K=K, G=K, BT=L, BC=16, BK=lbw._INTRA_BK or K, DOT_PREC="tf32"),
               4 * NT * H * (K // (lbw._INTRA_BK or K)), "<= 3 sub-chunks + 16 rows", 2.5 * thk * bf + 2.5 * thk * f4 + T * H * L * f4 / MB,
               2 * thk * f4, 2 * 1.5 * 2 * T * 16 * K * H / 1e9, "bf16 TC",
               "k, q and b re-read by the later / earlier sub-chunks (~x2.5); diagonal elementwise: 1.4 G exp",
               side={"fp32 FMA": 4 * T * 16 * K * H / 1e9, "exp": 1.4},
               # as launched, then all of K on 8 warps and tiles of 64 on 4 (notes/TUNING.md "2026-12-07 (35)")
               configs=[({}, lbw._INTRA_WARPS, lbw._INTRA_STAGES)]
               + [({"BK": bk}, warps, lbw._INTRA_STAGES) for bk, warps in ((K, 8), (64, 4))],
               reread_mb=1.5 * (thk * bf + thk * f4)),
        Launch("chunk_dqk (gate per channel)", lbw._chunk_dqk_kernel,
               dict(q="*bf16", k="*bf16", v="*bf16", gk="*bf16", b="*fp32", h=STATE_PTR, dh=STATE_PTR, do="*bf16",
                    dA="*fp32", dq_intra="*fp32", dk_intra="*fp32", dq="*bf16", dk="*bf16", dg="*bf16",
                    scale="fp32", T="i32", H="i32", NT="i32"),
               dict(K=K, V=V, G=K, BT=L, BK=64, BV=64, FLOOR=lin.GATE_FLOOR, GATE_GRAD=True, DOT_PREC="tf32",
                    SUM_PREC=lbw._sum_precision(torch.bfloat16)),
               2 * NT * H, "-",
               3 * thk * bf + 2 * 2 * thk * bf + 2 * states * sb + 2 * thk * f4 + thk * f4 + T * H * L * f4 / MB,
               3 * thk * bf, 2 * gemm, "bf16 TC",
               f"v and do read once per key tile (x2); the gate's triangle sums 3xTF32 ({tri:.1f} GFLOP x 3)",
               side={"tf32 TC": 3 * tri}, configs=[({}, lbw._PER_CHANNEL_WARPS, 3)], reread_mb=2 * thk * bf),
    ]


def kda_backward() -> list:
    """KDA's two kernels of its own after the reverse state pass (the state pass, the sub-chunk launches and the
    recomputed forward are the shared ones above)."""
    H, K, V = 32, 128, 128
    thk, thv, thl = T * H * K / MB, T * H * V / MB, T * H * L / MB
    states = NT * H * K * V / MB
    bf, f4, sb = 2, 4, STATE_BYTES
    nk = K // kda_bw._GRAD_BK
    gflop = NT * H * (3 * 2 * L * L * V + 3 * 2 * L * K * V + 2 * 2 * L * L * K) / 1e9
    bk = lbw._INTRA_BK or K
    wy_types = dict(k="*bf16", v="*bf16", b="*fp32", beta="*bf16", Akk="*fp32", w="*bf16", u="*bf16", kg="*bf16",
                    T="i32", H="i32", inverse="*bf16")
    wy_consts = dict(K=K, V=V, BT=L, BK=K, BV=64, BS=16, NB=L // 16, DOT_PREC="tf32", SOLVE_PREC="tf32")
    wy_io = (thk * (bf + f4) + thv * bf + T * H * bf / MB, 2 * thk * bf + thv * bf)
    wy_gflop = NT * H * 2 * L * L * (K + V) / 1e9
    def halves(variant, switches, note, configs):
        """The delta rule's reverse state pass in key halves, with these constexpr switches: the gated queries
        (GATED_Q) read no fp32 gates."""
        gates = 0 if switches.get("GATED_Q") else thk * f4
        return Launch("delta rule's reverse state pass, key halves" + variant, lbw._delta_state_grad_halves_kernel,
                      dict(q="*bf16", do="*bf16", b="*fp32", dh=STATE_PTR, dht="*fp32", dh0="*fp32", scale="fp32",
                           Aqk="*bf16", kg="*bf16", w="*bf16", du="*fp32", T="i32", H="i32", NT="i32"),
                      dict(K=K, V=V, BT=L, HALF=64, USE_DHT=False, STORE_DH0=False, DOT_PREC="tf32", **switches),
                      H * V // lbw._DELTA_HALVES_CONFIG[0], f"{NT} chunks",
                      (V // lbw._DELTA_HALVES_CONFIG[0]) * (3 * thk * bf + gates + thl * bf) + thv * bf,
                      states * sb + thv * f4, NT * H * (2 * 2 * L * L * V + 3 * 2 * L * K * V) / 1e9, "bf16 TC",
                      note, configs=[({"BV": bv}, warps, stages) for bv, warps, stages in configs])

    return [
        Launch("kda W, W' and K_g from the kept inverse (the recomputed forward)", kda_chunk._kda_wy_kernel,
               wy_types, dict(wy_consts, LOAD_INVERSE=True), NT * H, "2 value tiles",
               wy_io[0] + thl * bf, wy_io[1], wy_gflop, "tf32 TC", "X read in bf16; no solve"),
        Launch("kda W, W', K_g and the gated queries from the kept inverse (`_DELTA_GATED_QUERIES`)",
               kda_chunk._kda_wy_kernel, dict(wy_types, q="*bf16", qg="*bf16", scale="fp32"),
               dict(wy_consts, LOAD_INVERSE=True, GATED_Q=True), NT * H, "2 value tiles",
               wy_io[0] + thl * bf + thk * bf, wy_io[1] + thk * bf, wy_gflop, "tf32 TC",
               "the experiment: also reads q and writes scale · q ⊙ e^b"),
        Launch("kda solve with W, W' and K_g (the forward's, X stored)", kda_chunk._kda_wy_kernel,
               wy_types, dict(wy_consts, STORE_INVERSE=True), NT * H, "16 substitution steps, 2 value tiles",
               wy_io[0] + 2 * thl * f4, wy_io[1] + thl * bf, wy_gflop + NT * H * 4 * 2 * L ** 3 / 1e9, "tf32 TC",
               "A_kk read twice (the 64 x 64 tile and the [4, 16, 16] blocks)"),
        halves("", {}, "q, b, K_g, W and A_qk re-read per value tile; 256 dependent steps",
               (lbw._DELTA_HALVES_CONFIG, (32, 4, 2), (32, 4, 1), (64, 8, 1))),
        halves(", A_qk row-masked (`_DELTA_AQK_ROW_MASK`)", dict(AQK_ROW_MASK=True),
               "the experiment: A_qk's tile under its rows' mask, its upper triangle zeroed after the load",
               (lbw._DELTA_HALVES_CONFIG, (32, 4, 2))),
        halves(", gated queries and A_qk row-masked (both experiments)", dict(AQK_ROW_MASK=True, GATED_Q=True),
               "the experiments together: no fp32 gates or exponentials in the walk, A_qk with the step's copies",
               ((64, 4, 2), (64, 4, 3), (32, 4, 2), (32, 4, 3))),
        Launch("kda sub-chunk pairs (A_qk and A_kk in one launch)", lbw._chunk_dqk_intra_kernel,
               dict(q="*fp32", k="*fp32", b="*fp32", dA="*fp32", dq="*fp32", dk="*fp32", T="i32", H="i32",
                    dA_kk="*fp32", dk_rows="*fp32", beta="*bf16"),
               dict(K=K, G=K, BT=L, BC=16, BK=bk, DOT_PREC="tf32", KEY_PAIRS=True),
               4 * NT * H * (K // bk), "<= 3 sub-chunks + 16 rows", 3 * 2.5 * thk * f4 + 2 * thl * f4,
               3 * thk * f4, 2 * 2 * 1.5 * 2 * T * 16 * K * H / 1e9, "tf32 TC",
               "q, k and b (fp32) re-read by the later / earlier sub-chunks (~x2.5); one exponential per pair and "
               "channel serves both matrices", side={"fp32 FMA": 8 * T * 16 * K * H / 1e9, "exp": 1.4},
               configs=[({}, lbw._INTRA_WARPS, lbw._INTRA_STAGES), ({"BK": K}, 8, lbw._INTRA_STAGES)],
               reread_mb=3 * 1.5 * thk * f4),
        Launch("kda chunk grads (all but the pairs j < t)", kda_bw._kda_chunk_grad_kernel,
               dict(q="*bf16", k="*bf16", v="*bf16", b="*fp32", beta="*fp32", inverse="*bf16",
                    w="*bf16", u="*bf16", v_new="*bf16", states=STATE_PTR, dstates=STATE_PTR, do="*bf16", du="*fp32",
                    dq="*fp32", dk="*fp32", db="*fp32", dv="*bf16", dbeta="*fp32", dAqk="*fp32", dA="*fp32",
                    qn="*fp32", kn="*fp32", scale="fp32", T="i32", H="i32", NT="i32"),
               dict(K=K, V=V, BT=L, L2NORM=True, EPS=1e-6, STORE_QK=True, DOT_PREC="tf32"),
               NT * H, f"{nk} key tiles x 2 value tiles",
               2 * 2 * thk * bf + thk * f4 + thk * bf + 2 * thv * bf + (1 + nk) * (2 * thv * bf + thv * f4)
               + (1 + nk) * thl * bf + 2 * states * sb,
               5 * thk * f4 + thv * bf + 2 * thl * f4, gflop, "tf32 TC",
               f"do, U, dU and X re-read per key tile (x{nk}, from L2 mostly); q and k twice (the L2 norm first); "
               "dq, dk, db partials and q, k normalised written fp32",
               configs=[({"BK": kda_bw._GRAD_BK, "BV": kda_bw._GRAD_BV}, kda_bw._GRAD_WARPS, 1),
                        ({"BK": 64, "BV": 64}, 8, 1)],
               reread_mb=nk * (2 * thv * bf + thv * f4 + thl * bf) + 2 * thk * bf),
        Launch("kda combine (sums, dg, L2 norm)", kda_bw._kda_dqk_combine_kernel,
               dict(q="*bf16", k="*bf16", g="*fp32", beta="*bf16", dAqk="*fp32", dq_part="*fp32", dk_part="*fp32",
                    db_part="*fp32", dbeta_part="*fp32", dq_qk="*fp32", dk_rows="*fp32", dk_cols="*fp32",
                    dq="*bf16", dk="*bf16", dg="*fp32", dbeta="*bf16", T="i32", H="i32"),
               dict(K=K, BT=L, BR=kda_bw._COMBINE_ROWS, BK=K, L2NORM=True, EPS=1e-6, FLOOR=lin.GATE_FLOOR),
               NT * H, f"{L // kda_bw._COMBINE_ROWS} row blocks",
               2 * thk * bf + 7 * thk * f4 + T * H * (2 * f4 + bf) / MB, 2 * thk * bf + thk * f4 + T * H * bf / MB,
               0.0, "fp32 FMA", "six fp32 partials and g read, dA_qk's diagonal, β and dβ's partial",
               configs=[({}, kda_bw._COMBINE_WARPS, 1)]),
    ]


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def byte_table(title: str, launches: list) -> float:
    print(f"\n{title}\n")
    print("| launch | programs | loop | read MB | written MB | GFLOP | products on | bound ms | "
          "bound ms, re-reads in L2 | note |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    total = total_l2 = 0.0
    for ln in launches:
        total += ln.bound_ms()
        total_l2 += ln.bound_l2_ms()
        print(f"| {ln.name} | {ln.programs:,} | {ln.loop} | {_fmt(ln.read_mb)} | {_fmt(ln.write_mb)} | "
              f"{ln.gflop:.1f} | {ln.units} | {ln.bound_ms():.3f} | {ln.bound_l2_ms():.3f} | {ln.note} |")
    rd, wr = sum(ln.read_mb for ln in launches), sum(ln.write_mb for ln in launches)
    print(f"| **all** | | | {_fmt(rd)} | {_fmt(wr)} | {sum(ln.gflop for ln in launches):.0f} | | **{total:.2f}** | "
          f"**{total_l2:.2f}** | |")
    return total


def compile_table(launches: list) -> bool:
    print("\n| kernel | config (kwargs, warps, stages) | registers | spill B | HGMMA | HMMA | FFMA | shared KB | "
          "BAR.SYNC | STS | LDS | SHFL |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    spilled = False
    for ln in launches:
        for kwargs, warps, stages in _configs(ln):
            stats = inspect_binary(compile_launch(ln, kwargs, warps, stages))
            spilled |= stats["spill"] > 0
            cfg = " ".join(f"{k}={v}" for k, v in kwargs.items())
            print(f"| {ln.name} | {cfg} {warps}w {stages}s | {stats['regs']} | {stats['spill']} | {stats['hgmma']} | "
                  f"{stats['hmma']} | {stats['ffma']} | {stats['smem'] / 1024:.0f} | {stats['bar']} | {stats['sts']} | "
                  f"{stats['lds']} | {stats['shfl']} |", flush=True)
    return spilled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-compile", action="store_true", help="print the byte / FLOP tables only")
    parser.add_argument("--only", default="", help="compile only the launches whose name holds this text")
    args = parser.parse_args()
    families = (("Mamba-2 backward, B 1, T 16K, 80 heads x 64, dstate 128, bf16", mamba2_backward()),
                ("GLA backward, B 1, T 16K, 32 heads, K = V = 128, bf16", gla_backward()),
                ("KDA backward's own kernels, B 1, T 16K, 32 heads, K = V = 128, bf16", kda_backward()))
    spilled = False
    for title, launches in families:
        byte_table(title, launches)
        if not args.no_compile:
            spilled |= compile_table([ln for ln in launches if args.only in ln.name])
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
