"""Compile the TileLang GLA chunk kernels for sm_90a without a GPU, and say what came out: per kernel,
ptxas's registers, spills and static shared memory, where TileLang's dynamic shared memory ends, and the
instructions that matter (wgmma, TMA copies, cp.async, global loads and stores).

    python scripts/gla_tilelang_compile.py            # needs tilelang and nvcc (CUDA_HOME or /usr/local/cuda)
    python scripts/gla_tilelang_compile.py --keep DIR # also write each kernel's .cu and .ptx

Exits 1 if a kernel fails to compile, spills, has no wgmma, or starts a shared buffer past the 227 KB an
H200 block may have.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attention_kernels import peers
from attention_kernels.gla import tilelang_chunk as tc
from mla_tilelang_compile import compile_and_report   # it also puts nvcc on the PATH (CUDA_HOME)


def check(name, func, keep):
    ok, _, counts = compile_and_report(name, func, keep)
    return ok and counts["wgmma"] > 0

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write each kernel's .cu and .ptx here")
    keep = parser.parse_args().keep
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    tilelang = peers.tilelang()
    if tilelang is None:
        raise SystemExit("needs tilelang (pip install tilelang)")
    T = tilelang.language
    builds = {  # the benchmark's case (K = V = 128, bf16), and the narrowest with fp16 inputs and fp32 gates
        "states_K128_V128_bf16": tc._state_kernel(T, 128, 128, T.bfloat16, T.bfloat16),
        "output_K128_V128_bf16": tc._output_kernel(T, 128, 128, T.bfloat16, T.bfloat16),
        "states_K64_V64_fp16_g32": tc._state_kernel(T, 64, 64, T.float16, T.float32),
        "output_K64_V64_fp16_g32": tc._output_kernel(T, 64, 64, T.float16, T.float32),
    }
    ok = True
    for name, func in builds.items():
        try:
            ok &= check(name, func, keep)
        except Exception as e:  # noqa: BLE001 (report every kernel, then fail)
            print(f"FAILED: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}")
            ok = False
    print("\nOK" if ok else "\nFAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
