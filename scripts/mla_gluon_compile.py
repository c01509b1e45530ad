"""Compile the Gluon MLA decode kernel for sm_90a without a GPU, for both caches (dense and paged), and print
what ptxas reports.

    python scripts/mla_gluon_compile.py            # both variants: compile, print, check
    python scripts/mla_gluon_compile.py --keep DIR # also write each variant's .ttgir / .ptx / ptxas log there
    python scripts/mla_gluon_compile.py --module F # a modified copy of gluon_decode.py instead (a tuning variant)

Triton's shared-memory figure (all of it dynamic), ptxas's registers / spills, its performance notes, and a few
instruction counts from the PTX (wgmma, TMA copies, mbarrier ops, setmaxnreg). Exits 1 if compilation fails, or
ptxas spills, or serializes the wgmma pipeline, or shared memory exceeds 227 KB, or the two variants' consumers
differ (only the copy warp should). Needs no CUDA device: the target is given explicitly.
Note: ptxas's "Used N registers" is the launch bound (maxnreg 168); the warpgroups then
move to setmaxnreg's values (240 / 240 / 24), which the PTX counts show.
"""
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (attention_kernels/__init__ would pick the interpreter)

import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from attention_kernels.mla import gluon_decode as gd

TARGET = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 232448  # bytes of shared memory one CTA may use on H100/H200 (227 KB)
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
H = 128  # heads of the benchmark shape (only enters index arithmetic)

SIG = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "seqlens_ptr": "*i32", "bt_ptr": "*i32", "o_ptr": "*bf16",
       "lse_ptr": "*fp32", "ws_o_ptr": "*fp32", "ws_lse_ptr": "*fp32", "scale_log2": "fp32", "t_max": "i32",
       "stride_kb": "i32", "stride_kt": "i32", "stride_bt": "i32", "num_splits": "i32"}


def ptxas_stats(ptx: str, keep: Path | None, tag: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "k.ptx"
        f.write_text(ptx)
        r = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(f), "-o", str(Path(tmp) / "k.cubin")],
                           check=False, capture_output=True, text=True)
        log = r.stdout + r.stderr
    if keep:
        (keep / f"{tag}.ptxas.log").write_text(log)
    if r.returncode != 0:
        raise RuntimeError(f"ptxas failed (rc {r.returncode}):\n{log}")
    regs = re.search(r"Used (\d+) registers", log)
    spill_st = re.search(r"(\d+) bytes spill stores", log)
    spill_ld = re.search(r"(\d+) bytes spill loads", log)
    smem = re.search(r"(\d+) bytes smem", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return {"regs": int(regs.group(1)) if regs else None,
            "spill_stores": int(spill_st.group(1)) if spill_st else 0,
            "spill_loads": int(spill_ld.group(1)) if spill_ld else 0,
            "static_smem": int(smem.group(1)) if smem else 0,
            "stack": int(stack.group(1)) if stack else 0,
            "log": log}


def ptx_counts(ptx: str) -> dict:
    pats = {"wgmma": r"wgmma\.mma_async", "wgmma_commit": r"wgmma\.commit_group", "wgmma_wait": r"wgmma\.wait_group",
            "tma_load": r"cp\.async\.bulk\.tensor", "mbar_arrive": r"mbarrier\.arrive",
            "mbar_wait": r"mbarrier\.try_wait",
            "bar_sync": r"\bbar(rier)?\.sync", "setmaxnreg": r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+\d+",
            "tensormap": r"tensormap", "ld_local": r"ld\.local", "st_shared": r"st\.shared", "ld_shared": r"ld\.shared",
            "stmatrix": r"stmatrix", "ldmatrix": r"ldmatrix"}
    out = {k: len(re.findall(v, ptx)) for k, v in pats.items()}
    out["setmaxnreg_values"] = sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx)))
    shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
    out["wgmma_shapes"] = shapes
    return out


def build(paged: bool):
    consts = {"H": H, "BN": gd.BN, "STAGES": gd.STAGES, "D_V": gd.D_V, "D_PE": gd.D_PE,
              "CONSUMER_REGS": gd.WS_CONSUMER_REGS, "PAGED": paged, "num_warps": 4}
    fn = gd._mla_decode_ws_kernel
    missing = set(fn.arg_names) - set(SIG) - set(consts)
    if missing:
        raise SystemExit(f"the kernel has arguments this script does not know: {sorted(missing)}")
    sig = dict(SIG, **{k: "constexpr" for k in consts})
    # What the launcher would see at the benchmark shape: pointers 16-byte aligned (ints are not specialized).
    div16 = [["tt.divisibility", 16]]
    attrs = {(fn.arg_names.index(a), ): div16
             for a in ("q_ptr", "kv_ptr", "seqlens_ptr", "bt_ptr", "o_ptr", "lse_ptr", "ws_o_ptr", "ws_lse_ptr")}
    return triton.compile(GluonASTSource(fn, sig, consts, attrs), target=TARGET,
                          options={"num_warps": 4, "maxnreg": gd.WS_MAXNREG})


def check(paged: bool, keep: Path | None) -> tuple[list, dict]:
    tag = "mla_decode_ws_paged" if paged else "mla_decode_ws_dense"
    print(f"\n=== {tag} (BN, STAGES = {gd.BN}, {gd.STAGES}) ===")
    return report(build(paged), tag, keep)


def report(c, tag: str, keep: Path | None, spills_allowed: str | None = None) -> tuple[list, dict]:
    """Print what Triton and ptxas made of a compiled Gluon kernel `c` and return (problems, PTX counts):
    spills (unless `spills_allowed` gives the reason they are, printed instead), shared memory past the
    limit, a serialized wgmma pipeline. `keep`: a folder for its .ttgir, .ptx and ptxas log."""
    ptx = c.asm["ptx"]
    if keep:
        (keep / f"{tag}.ttgir").write_text(c.asm["ttgir"])
        (keep / f"{tag}.ptx").write_text(ptx)
    st = ptxas_stats(ptx, keep, tag)
    smem = c.metadata.shared
    print(f"triton: num_warps (total) {c.metadata.num_warps}, shared {smem} B ({smem / 1024:.1f} KB), "
          f"global scratch {c.metadata.global_scratch_size} B")
    print(f"ptxas : {st['regs']} registers, spill stores {st['spill_stores']} B, spill loads "
          f"{st['spill_loads']} B, stack {st['stack']} B")
    serialized = False
    for line in st["log"].splitlines():
        low = line.lower()
        if "error" in low or "warning" in low or "performance loss" in low or "injected" in low:
            print("ptxas :", line.strip())
        serialized |= "wgmma.mma_async instructions are serialized" in line
    counts = ptx_counts(ptx)
    print("ptx   :", counts)
    problems = []
    if (st["spill_stores"] or st["spill_loads"]) and spills_allowed:
        print(f"note  : {tag} spills; {spills_allowed}")
    elif st["spill_stores"] or st["spill_loads"]:
        problems.append(f"{tag}: register spills")
    if smem > SMEM_LIMIT:
        problems.append(f"{tag}: shared memory {smem} > {SMEM_LIMIT}")
    if serialized:
        problems.append(f"{tag}: ptxas serialized the wgmma instructions")
    return problems, counts


def main(argv):
    global gd
    if "--module" in argv:   # a variant file, loaded as `tune_probe.py mla_variants` loads them
        from tune_probe import load_module
        gd = load_module(argv[argv.index("--module") + 1])
    keep = None
    if "--keep" in argv:
        keep = Path(argv[argv.index("--keep") + 1])
        keep.mkdir(parents=True, exist_ok=True)
    print(f"triton {triton.__version__}, target {TARGET}")
    problems, counts = [], {}
    for paged in (False, True):
        try:
            p, counts[paged] = check(paged, keep)
            problems += p
        except Exception:  # noqa: BLE001 - report the failure, then exit non-zero
            traceback.print_exc()
            problems.append(f"{'paged' if paged else 'dense'}: compilation error")
    if len(counts) == 2:
        # the consumers are shared: the same wgmma work in both (the copy warp is what differs)
        for k in ("wgmma", "wgmma_wait", "setmaxnreg_values", "wgmma_shapes"):
            if counts[False][k] != counts[True][k]:
                problems.append(f"{k} differs between dense and paged: {counts[False][k]} vs {counts[True][k]}")
    print("FAIL  : " + "; ".join(problems) if problems else "OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
