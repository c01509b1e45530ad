"""Compile FlashAttention's split-KV decode kernel (attention_kernels/flash_attn/decode.py) for sm_90a without a GPU and print
what ptxas reports: registers, spills, shared memory, and whether K and V arrive by pipelined cp.async copies.

    python scripts/flash_attn_decode_compile.py

bf16, D = 128, a group of 4 query heads (BM = 16 rows), every tile in DECODE_TILES; one query token, and four
with the causal mask; with and without the split. The pointers and the caches' strides are marked 16-divisible,
as a contiguous cache's are when Triton specializes them at launch. Exits 1 if ptxas spills.
"""
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (attention_kernels/__init__ would pick the interpreter)

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attention_kernels.flash_attn import decode

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
POINTERS = {"q": "*bf16", "k_cache": "*bf16", "v_cache": "*bf16", "seqlens": "*i32", "o": "*bf16", "lse": "*fp32",
            "ws_o": "*fp32", "ws_lse": "*fp32"}
STRIDES = ["stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt", "stride_vh"]


def compile_one(s_q, causal, split, bn, warps, stages):
    fn = decode._decode_split_kernel
    consts = {"S_Q": s_q, "GROUP": 4, "D": 128, "CAUSAL": causal, "SPLIT": split, "BM": 16, "BN": bn}
    signature = dict(POINTERS, HKV="i32", num_splits="i32", qk_scale="fp32", **{s: "i32" for s in STRIDES},
                     **{k: "constexpr" for k in consts})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in [*POINTERS, *STRIDES]}
    return triton.compile(ASTSource(fn, signature, consts, attrs), target=TARGET,
                          options={"num_warps": warps, "num_stages": stages})


def ptxas(ptx: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "k.ptx"
        source.write_text(ptx)
        done = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(source), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"ptxas failed:\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


def main() -> int:
    spilled = False
    for split in (True, False):
        for s_q, causal in ((1, False), (4, True)):
            for bn, warps, stages in decode.DECODE_TILES:
                compiled = compile_one(s_q, causal, split, bn, warps, stages)
                log = ptxas(compiled.asm["ptx"])
                registers = int(re.search(r"Used (\d+) registers", log).group(1))
                stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
                copies = len(re.findall(r"cp\.async\.cg", compiled.asm["ptx"]))
                scalar = len(re.findall(r"ld\.global\.b16", compiled.asm["ptx"]))
                shared_kb = compiled.metadata.shared / 1024
                print(f"S_q={s_q} causal={causal!s:5} split={split!s:5} BN={bn:3} warps={warps} stages={stages}: "
                      f"{registers} registers, spills {stores}/{loads} B, shared {shared_kb:.0f} KB, "
                      f"{copies} cp.async, {scalar} 2-byte loads")
                spilled |= stores + loads > 0
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
