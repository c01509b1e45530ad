"""Compile the Gluon FlashAttention backward's dK/dV kernel for sm_90a without a GPU and print what ptxas reports.

    python scripts/flash_attn_gluon_bwd_compile.py                   # D 64 / 128 x causal or not x loop, bf16
    python scripts/flash_attn_gluon_bwd_compile.py --only 128 causal # one configuration (what the CPU test runs)
    python scripts/flash_attn_gluon_bwd_compile.py --only 128 causal overlapped   # its overlapped loop
    python scripts/flash_attn_gluon_bwd_compile.py --only 128 causal in-order-dq  # dQ inside (overlapped-dq too)
    python scripts/flash_attn_gluon_bwd_compile.py --keep DIR        # also write each variant's .ttgir / .ptx / log

A word `--only` does not take (a misspelled loop, say) ends the script with a message (`parse_args`).

Per variant (loop: in order, overlapped, each with its own ring slots, `gluon_backward.bwd_tiles`; each also with
dQ accumulated inside the kernel, DQ_ATOMIC, `in-order-dq` and `overlapped-dq`): Triton's shared-memory figure,
ptxas's registers / spills / performance notes, and instruction counts from the PTX (wgmma, TMA copies, mbarrier
ops, setmaxnreg, global atomics), through `mla_gluon_compile.py`'s readers. Each is compiled with dK and dV stored
as bf16 (a group in one part); the split group's fp32 workspace changes only the stores. Exits 1 if a compilation
fails, ptxas spills or serializes the wgmma pipeline, shared memory exceeds 227 KB, or the PTX lacks wgmma or TMA
copies; the overlapped loop must also keep its partial waits (`wgmma.wait_group 1` at 3 of each update's 4 commit
groups: S^T, dP^T and dV each waited on with the next product still running; the dQ products are each waited on
alone); a DQ_ATOMIC variant must hold global atomic adds, any other none. Needs no CUDA device: the target is
given explicitly.
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
       "dq_ptr": "*fp32", "lse_ptr": "*fp32", "delta_ptr": "*fp32", "scale_log2": "fp32", "sm_scale": "fp32",
       "T": "i32", "S": "i32", "HQ": "i32", "HKV": "i32", "PARTS": "i32", "PART_HEADS": "i32", "row_stride": "i32"}
POINTERS = ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dk_ptr", "dv_ptr", "dq_ptr", "lse_ptr", "delta_ptr")


# the loops `--only` takes: (the consumers' loop, DQ_ATOMIC: dQ accumulated in the kernel by atomics, and split how)
SCHEDULES = {"in-order": (gb.IN_ORDER.value, 0), "overlapped": (gb.OVERLAPPED.value, 0),
             "in-order-dq": (gb.IN_ORDER.value, gb.DQ_KEYS.value),
             "overlapped-dq": (gb.OVERLAPPED.value, gb.DQ_KEYS.value),
             "in-order-dqcols": (gb.IN_ORDER.value, gb.DQ_COLUMNS.value),
             "overlapped-dqcols": (gb.OVERLAPPED.value, gb.DQ_COLUMNS.value)}


def _overlapped(schedule: str) -> bool:
    return SCHEDULES[schedule][0] == gb.OVERLAPPED.value


def build(D: int, causal: bool, schedule: str):
    bm, stages = gb.bwd_tiles(D, overlap=_overlapped(schedule))
    loop, dq_atomic = SCHEDULES[schedule]
    consts = {"D": D, "BM": bm, "STAGES": stages, "CAUSAL": causal, "SCHEDULE": loop, "DQ_ATOMIC": dq_atomic,
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
    suffix = '' if schedule == 'in-order' else '_' + schedule.replace('-', '_')
    tag = f"fa_bwd_dkdv_ws_d{D}_{'causal' if causal else 'full'}{suffix}"
    tiles = gb.bwd_tiles(D, overlap=_overlapped(schedule))
    print(f"\n=== {tag} (BM, STAGES = {tiles}) ===")
    compiled = build(D, causal, schedule)
    problems, counts = report(compiled, tag, keep)
    if not counts["wgmma"] or not counts["tma_load"]:
        problems.append(f"{tag}: no wgmma or no TMA copy in the PTX")
    # a tile's 4 products are 4 commit groups (with dQ, D / DQ_COLS more, each waited on alone); the overlapped
    # update waits with one still running after 3 of its 4
    ptx = compiled.asm["ptx"]
    partial = len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx))
    print(f"ptx   : wgmma.wait_group 1 at {partial} of {counts['wgmma_wait']} waits, "
          f"{counts['wgmma_commit']} commit groups")
    dq_atomic = SCHEDULES[schedule][1]
    dq_products = {0: 0, gb.DQ_KEYS.value: D // gb.DQ_COLS.value, gb.DQ_COLUMNS.value: 1}[dq_atomic]
    per_tile = 4 + dq_products
    expected = 3 * counts["wgmma_commit"] // per_tile if _overlapped(schedule) else 0
    if partial != expected:
        problems.append(f"{tag}: {partial} waits with one product running, expected {expected}")
    # the dQ shares' atomic adds (red: their result unused), and how many fp32 each carries
    reds = re.findall(r"\b(?:red|atom)\.global[\w.]*", ptx)
    counts["dq_atomics"] = {op: reds.count(op) for op in sorted(set(reds))}
    print(f"ptx   : global atomics {counts['dq_atomics']}")
    if dq_atomic and not reds:
        problems.append(f"{tag}: no global atomic add in the PTX")
    if not dq_atomic and reds:
        problems.append(f"{tag}: global atomics without DQ_ATOMIC")
    return problems, counts


def main(argv):
    keep, only = parse_args(argv, SCHEDULES)
    variants = [(D, causal, schedule) for schedule in SCHEDULES for D in (64, 128) for causal in (False, True)]
    if only is not None:
        variants = [only]
    return compile_variants(variants, check, keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
