"""Compile the TileLang MLA decode kernels for sm_90a without a GPU, and say what came out: per kernel,
ptxas's registers, spills and static shared memory, where TileLang's dynamic shared memory ends, and the
instructions that matter (wgmma, TMA copies, cp.async, global loads).

    python scripts/mla_tilelang_compile.py            # needs tilelang and nvcc (CUDA_HOME or /usr/local/cuda)
    python scripts/mla_tilelang_compile.py --keep DIR # also write each kernel's .cu and .ptx

Exits 1 if a kernel fails to compile, spills, or starts a shared buffer past the 227 KB an H200 block may have.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
os.environ["PATH"] = f"{os.environ['CUDA_HOME']}/bin{os.pathsep}{os.environ['PATH']}"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attention_kernels import peers
from attention_kernels.mla import tilelang_decode as td

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SMEM_LIMIT = 227 * 1024
PTX_COUNTS = {"wgmma": r"wgmma\.mma_async", "TMA loads": r"cp\.async\.bulk\.tensor",
              "cp.async": r"cp\.async\.ca|cp\.async\.cg", "global loads": r"ld\.global", "global stores": r"st\.global"}


def last_smem_offset(source: str) -> int:
    """Where the last buffer of TileLang's dynamic shared memory starts, read off the CUDA source's
    `buf_dyn_shmem + offset` lines (the source does not give that buffer's size)."""
    return max((int(x) for x in re.findall(r"buf_dyn_shmem \+ (\d+)\)", source)), default=0)


def zeroing_in_consumers(source: str) -> bool:
    """The decode kernel's last-tile zeroing (a store into kv_c) is done by the consumer warpgroups, after
    they waited for the tile's copy, and not by the producer, whose copy would overwrite it."""
    producer_at, consumer_at = source.find("warpgroup_reg_dealloc"), source.find("warpgroup_reg_alloc<")
    store = re.compile(r"\*\(uint4\*\)\(\(\(bfloat16_t\*\)kv_c\).*\) = ")
    if min(producer_at, consumer_at) < 0 or producer_at > consumer_at:
        return False
    producer, consumer = source[producer_at:consumer_at], source[consumer_at:]
    first_store = store.search(consumer)
    return (store.search(producer) is None and first_store is not None
            and consumer.find(".wait(", 0, first_store.start()) >= 0)


def compile_and_report(name, func, keep):
    """Compile a TileLang kernel for sm_90a, run ptxas on its PTX and print what came out. Returns (ok: it
    compiled without spills and its shared memory fits; its CUDA source; PTX instruction counts).
    `keep`: a folder for its .cu and .ptx."""
    tilelang = peers.tilelang()
    print(f"\n=== {name} ===", flush=True)
    kernel = tilelang.compile(func, target=TARGET)
    source, ptx = kernel.get_kernel_source(), kernel._get_ptx()
    with tempfile.TemporaryDirectory() as tmp:
        ptx_file, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx_file.write_text(ptx)
        done = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(ptx_file), "-o", str(cubin)],
                              check=False, capture_output=True, text=True)
    info = done.stdout + done.stderr
    print("\n".join(line for line in info.splitlines() if "Used" in line or "spill" in line or "error" in line))
    counts = {k: len(re.findall(p, ptx)) for k, p in PTX_COUNTS.items()}
    smem = last_smem_offset(source)
    print(f"PTX: {counts}; dynamic shared memory: the last buffer starts at {smem} B ({smem / 1024:.1f} KB)")
    if keep:
        (keep / f"{name}.cu").write_text(source)
        (keep / f"{name}.ptx").write_text(ptx)
    spills = re.search(r"(\d+) bytes spill stores", info)
    ok = done.returncode == 0 and spills is not None and spills.group(1) == "0" and smem <= SMEM_LIMIT
    return ok, source, counts


def check(name, func, keep):
    ok, source, _ = compile_and_report(name, func, keep)
    print("warp-specialized (setmaxnreg):", "warpgroup_reg_alloc" in source)
    if name.startswith("decode"):
        placed = zeroing_in_consumers(source)
        print("last-tile zeroing in the consumer warpgroups, after the copy's wait:", placed)
        ok &= placed
    return ok

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
    builds = {
        "decode_H128_single_pass": td._decode_kernel(T, 128, False, T.bfloat16),
        "decode_H128_split": td._decode_kernel(T, 128, True, T.bfloat16),
        "decode_H16_single_pass": td._decode_kernel(T, 16, False, T.bfloat16),
        "merge_H128": td._merge_kernel(T, 128, T.bfloat16),
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
