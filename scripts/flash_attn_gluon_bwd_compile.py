"""Compile the Gluon FlashAttention backward's dK/dV kernel for sm_90a without a GPU and print what ptxas reports.

    python scripts/flash_attn_gluon_bwd_compile.py                   # D 64 / 128 x causal or not, bf16
    python scripts/flash_attn_gluon_bwd_compile.py --only 128 causal # one configuration (what the CPU test runs)
    python scripts/flash_attn_gluon_bwd_compile.py --keep DIR        # also write each variant's .ttgir / .ptx / log

`--only` shares the forward's parser (`parse_args`): a word it does not take, a loop other than in-order (the
backward has one), ends the script with a message.

Per variant (its tiles `gluon_backward.BWD_TILES`): Triton's shared-memory figure, ptxas's registers / spills /
performance notes, and instruction counts from the PTX (wgmma, TMA copies, mbarrier ops, setmaxnreg), through
`mla_gluon_compile.py`'s readers. Each is compiled with dK and dV stored as bf16 (a group in one part); the split
group's fp32 workspace changes only the stores. Exits 1 if a compilation fails, ptxas spills or serializes the
wgmma pipeline, shared memory exceeds 227 KB, or the PTX lacks wgmma or TMA copies. Needs no CUDA device: the
target is given explicitly.
Note: ptxas's "Used N registers" is the launch bound (maxnreg); the partitions then move to setmaxnreg's values.
"""
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (attention_kernels would pick the interpreter)

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from attention_kernels.flash_attn import gluon_backward as gb
from flash_attn_gluon_compile import compile_variants, compile_warp_specialized, parse_args
from mla_gluon_compile import report

SIG = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "do_ptr": "*bf16", "dk_ptr": "*bf16", "dv_ptr": "*bf16",
       "lse_ptr": "*fp32", "delta_ptr": "*fp32", "scale_log2": "fp32", "sm_scale": "fp32", "T": "i32", "S": "i32",
       "HQ": "i32", "HKV": "i32", "PARTS": "i32", "row_stride": "i32"}
POINTERS = ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dk_ptr", "dv_ptr", "lse_ptr", "delta_ptr")


LOOPS = ("in-order", )   # the loop words `--only` takes: the backward has one


def build(D: int, causal: bool):
    bm, stages = gb.BWD_TILES[D]
    consts = {"D": D, "BM": bm, "STAGES": stages, "CAUSAL": causal, "CONSUMER_REGS": gb.WS_CONSUMER_REGS,
              "PRODUCER_REGS": gb.WS_PRODUCER_REGS, "num_warps": 4}
    return compile_warp_specialized(gb.attn_bwd_dkdv_ws_kernel, SIG, POINTERS, consts, gb.WS_MAXNREG)


def check(D: int, causal: bool, keep: Path | None) -> tuple[list, dict]:
    tag = f"fa_bwd_dkdv_ws_d{D}_{'causal' if causal else 'full'}"
    print(f"\n=== {tag} (BM, STAGES = {gb.BWD_TILES[D]}) ===")
    compiled = build(D, causal)
    problems, counts = report(compiled, tag, keep)
    if not counts["wgmma"] or not counts["tma_load"]:
        problems.append(f"{tag}: no wgmma or no TMA copy in the PTX")
    return problems, counts


def main(argv):
    keep, only = parse_args(argv, LOOPS)
    variants = [(D, causal) for D in (64, 128) for causal in (False, True)]
    if only is not None:
        variants = [only[:2]]
    return compile_variants(variants, check, keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
