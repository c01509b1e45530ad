"""Compile Mamba-2's two state kernels (attention_kernels/mamba2/chunk.py) for sm_90a without a GPU and print
what ptxas reports: registers, spills, and for the chunk-state kernel its tensor-core instructions.

    python scripts/ssd_state_compile.py

bf16 inputs, headdim 64, dstate 128, chunks of 64 and 256. `_ssd_chunk_state_kernel` (every chunk's own state)
in each of its GPU tiles; `_ssd_state_pass_kernel` (the walk over the chunks) with bf16 states (read from an
fp32 buffer of local states) and with fp32 ones (written over the local states in place), with initial and final
states. The
pointers are marked 16-divisible, as contiguous tensors' are when Triton specializes them at launch. Exits 1 if
ptxas spills.
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

from attention_kernels.mamba2 import chunk

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
HEADDIM, DSTATE = 64, 128


def compile_kernel(fn, pointers: dict, ints: list, consts: dict, warps: int, stages: int):
    signature = dict(pointers, **{n: "i32" for n in ints}, **{k: "constexpr" for k in consts})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in pointers}
    return triton.compile(ASTSource(fn, signature, consts, attrs), target=TARGET,
                          options={"num_warps": warps, "num_stages": stages})


def ptxas(ptx: str) -> tuple[int, int, int]:
    """(registers, spill-store bytes, spill-load bytes)"""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "k.ptx"
        source.write_text(ptx)
        done = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(source), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"ptxas failed:\n{done.stdout}{done.stderr}")
    log = done.stdout + done.stderr
    stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    return int(re.search(r"Used (\d+) registers", log).group(1)), stores, loads


def main() -> int:
    spilled = False
    for L in (64, 256):
        for config in chunk._CHUNK_STATE_CONFIGS:
            consts = dict(N=DSTATE, P=HEADDIM, L=L, BT=min(L, chunk.BLOCK), **config.kwargs, DOT_PREC="tf32")
            compiled = compile_kernel(chunk._ssd_chunk_state_kernel.fn,
                                      {"B": "*bf16", "x": "*bf16", "dt": "*fp32", "b": "*fp32", "local": "*fp32"},
                                      ["T", "H", "NT", "HPG", "G"], consts, config.num_warps, config.num_stages)
            regs, stores, loads = ptxas(compiled.asm["ptx"])
            wgmma = len(re.findall(r"wgmma\.mma_async", compiled.asm["ptx"]))
            mma = len(re.findall(r"\bmma\.sync", compiled.asm["ptx"]))
            print(f"chunk states  L={L:3} BK={config.kwargs['BK']:3} BV={config.kwargs['BV']:2} "
                  f"warps={config.num_warps} stages={config.num_stages}: {regs} registers, spills {stores}/{loads} B, "
                  f"{wgmma} wgmma, {mma} mma.sync, shared {compiled.metadata.shared / 1024:.0f} KB")
            spilled |= stores + loads > 0
        for in_place in (False, True):
            consts = dict(N=DSTATE, P=HEADDIM, L=L, BE=chunk._PASS_BLOCK, IN_PLACE=in_place, USE_H0=True,
                          STORE_HT=True)
            pointers = {"local": "*fp32", "b": "*fp32", "h": "*fp32" if in_place else "*bf16", "h0": "*fp32",
                        "ht": "*fp32"}
            compiled = compile_kernel(chunk._ssd_state_pass_kernel, pointers, ["T", "H", "NT"], consts,
                                      chunk._PASS_WARPS, 1)
            regs, stores, loads = ptxas(compiled.asm["ptx"])
            print(f"state pass    L={L:3} BE={chunk._PASS_BLOCK} warps={chunk._PASS_WARPS} "
                  f"{'fp32 in place' if in_place else 'bf16 states  '}: {regs} registers, spills {stores}/{loads} B")
            spilled |= stores + loads > 0
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
