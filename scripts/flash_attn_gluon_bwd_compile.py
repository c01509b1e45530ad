"""Compile the Gluon FlashAttention backward's dK/dV kernel for sm_90a without a GPU and print what ptxas reports.

    python scripts/flash_attn_gluon_bwd_compile.py                   # D 64 / 128 x causal or not x loop, bf16
    python scripts/flash_attn_gluon_bwd_compile.py --only 128 causal # one configuration (what the CPU test runs)
    python scripts/flash_attn_gluon_bwd_compile.py --only 128 causal overlapped   # its overlapped loop
    python scripts/flash_attn_gluon_bwd_compile.py --keep DIR        # also write each variant's .ttgir / .ptx / log

A word `--only` does not take (a misspelled loop, say) ends the script with a message (`parse_args`).

Per variant (loop: in order, overlapped, each with its own ring slots, `gluon_backward.bwd_tiles`): Triton's
shared-memory figure, ptxas's registers / spills / performance notes, and instruction counts from the PTX (wgmma,
TMA copies, mbarrier ops, setmaxnreg), through `mla_gluon_compile.py`'s readers. Each is compiled with dK and dV
stored as bf16 (a group in one part); the split group's fp32 workspace changes only the stores. Exits 1 if a
compilation fails, ptxas spills or serializes the wgmma pipeline, shared memory exceeds 227 KB, or the PTX lacks
wgmma or TMA copies; the overlapped loop must also keep its partial waits (`wgmma.wait_group 1` at 3 of each
update's 4 commit groups: S^T, dP^T and dV each waited on with the next product still running). Needs no CUDA
device: the target is given explicitly.
Note: ptxas's "Used N registers" is the launch bound (maxnreg); the partitions then move to setmaxnreg's values.
"""
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (attention_kernels would pick the interpreter)

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton
from triton.experimental.gluon._runtime import GluonASTSource

from attention_kernels.flash_attn import gluon_backward as gb
from flash_attn_gluon_compile import compile_variants, parse_args
from mla_gluon_compile import TARGET, report

SIG = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "do_ptr": "*bf16", "dk_ptr": "*bf16", "dv_ptr": "*bf16",
       "lse_ptr": "*fp32", "delta_ptr": "*fp32", "scale_log2": "fp32", "sm_scale": "fp32", "T": "i32", "S": "i32",
       "HQ": "i32", "HKV": "i32", "PARTS": "i32", "row_stride": "i32"}
POINTERS = ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dk_ptr", "dv_ptr", "lse_ptr", "delta_ptr")


SCHEDULES = {"in-order": gb.IN_ORDER.value, "overlapped": gb.OVERLAPPED.value}


def build(D: int, causal: bool, schedule: str):
    bm, stages = gb.bwd_tiles(D, overlap=schedule == "overlapped")
    consts = {"D": D, "BM": bm, "STAGES": stages, "CAUSAL": causal, "SCHEDULE": SCHEDULES[schedule],
              "CONSUMER_REGS": gb.WS_CONSUMER_REGS, "PRODUCER_REGS": gb.WS_PRODUCER_REGS, "num_warps": 4}
    fn = gb.attn_bwd_dkdv_ws_kernel
    missing = set(fn.arg_names) - set(SIG) - set(consts)
    if missing:
        raise SystemExit(f"the kernel has arguments this script does not know: {sorted(missing)}")
    sig = dict(SIG, **{k: "constexpr" for k in consts})
    div16 = [["tt.divisibility", 16]]   # what the launcher sees: pointers 16-byte aligned (ints not specialized)
    attrs = {(fn.arg_names.index(a), ): div16 for a in POINTERS}
    return triton.compile(GluonASTSource(fn, sig, consts, attrs), target=TARGET,
                          options={"num_warps": 4, "maxnreg": gb.WS_MAXNREG})


def check(D: int, causal: bool, schedule: str, keep: Path | None) -> tuple[list, dict]:
    tag = f"fa_bwd_dkdv_ws_d{D}_{'causal' if causal else 'full'}{'' if schedule == 'in-order' else '_' + schedule}"
    tiles = gb.bwd_tiles(D, overlap=schedule == "overlapped")
    print(f"\n=== {tag} (BM, STAGES = {tiles}) ===")
    compiled = build(D, causal, schedule)
    problems, counts = report(compiled, tag, keep)
    if not counts["wgmma"] or not counts["tma_load"]:
        problems.append(f"{tag}: no wgmma or no TMA copy in the PTX")
    # a tile's 4 products are 4 commit groups; the overlapped update waits with one still running after 3 of them
    partial = len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", compiled.asm["ptx"]))
    print(f"ptx   : wgmma.wait_group 1 at {partial} of {counts['wgmma_wait']} waits, "
          f"{counts['wgmma_commit']} commit groups")
    expected = 3 * counts["wgmma_commit"] // 4 if schedule == "overlapped" else 0
    if partial != expected:
        problems.append(f"{tag}: {partial} waits with one product running, expected {expected}")
    return problems, counts


def main(argv):
    keep, only = parse_args(argv, SCHEDULES)
    variants = [(D, causal, schedule) for schedule in SCHEDULES for D in (64, 128) for causal in (False, True)]
    if only is not None:
        variants = [only]
    return compile_variants(variants, check, keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
