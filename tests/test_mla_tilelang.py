"""The TileLang MLA decode kernels (attention_kernels/mla/tilelang_decode.py) against the fp32 reference.

GPU (marked `gpu`, skipped without CUDA, and without TileLang): DeepSeek's dims in bf16, dense and paged
caches (pages of 64 in shuffled order, NaN in every unused slot and page, lengths that end mid-page), the
single pass and split-KV (empty slices included), B in {1, 4}, H in {16, 128}, a CUDA graph's replay.
CPU (always): the module imports without TileLang, the entry refuses bad input before it asks for TileLang,
says TileLang is needed when it is missing, and its plumbing (layouts, identity table, split and merge) is
right with the two kernels replaced by PyTorch versions of their contracts.
"""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from input_cases import Case, bad_input_cases, case_id, expect_refusal
from test_mla import check_graph_replay, flashmla_pages, make_case

from attention_kernels import peers
from attention_kernels.common import ON_GPU, assert_close, tolerance
from attention_kernels.mla import mla_decode_ref, mla_decode_tilelang, tilelang_decode, yarn_softmax_scale

BF16_TOL = tolerance(torch.bfloat16)
needs_tilelang = pytest.mark.skipif(peers.tilelang() is None, reason="needs TileLang (pip install tilelang)")


def check_against_reference(q, kv, lens, table, num_splits):
    scale = yarn_softmax_scale()
    out, lse = mla_decode_tilelang(q, kv, table, lens, softmax_scale=scale, num_splits=num_splits)
    ref, ref_lse = mla_decode_ref(q, kv, table, lens, 512, scale)
    assert out.dtype == q.dtype and out.shape == ref.shape and lse.shape == ref_lse.shape
    assert not out.isnan().any() and not lse.isnan().any()
    assert_close(out, ref, BF16_TOL, "out")
    assert (lse - ref_lse).abs().max().item() < 1e-3
    return out, lse


# ---------------------------------------------------------------------------------- GPU
LENS = {1: [1000], 4: [1, 63, 65, 1000]}   # one position, a page but one, a page and one, mid-page


@pytest.mark.gpu
@needs_tilelang
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["single-pass", "split3", "split-auto"])
@pytest.mark.parametrize("cache", ["dense", "paged", "paged-4d"])
@pytest.mark.parametrize("B, H", [(1, 16), (1, 128), (4, 16), (4, 128)], ids=lambda v: str(v))
def test_gpu_matches_reference(B, H, cache, num_splits):
    lens = torch.tensor(LENS[B], dtype=torch.int32)
    q, kv, lens, _ = make_case(B, 1, H, 576, int(lens.max()), dtype=torch.bfloat16, lens=lens)  # NaN past lens
    table = None
    if cache != "dense":
        kv, table = flashmla_pages(kv, lens)   # shuffled pages of 64, NaN in unused slots, -1 in unused entries
        if cache == "paged-4d":
            kv = kv[:, :, None, :]
    check_against_reference(q, kv, lens, table, num_splits)


@pytest.mark.gpu
@needs_tilelang
def test_gpu_empty_slices_and_two_query_rows():
    """40 slices leave the short sequences' last slices empty (o = 0, lse = -inf, no weight in the merge);
    s_q = 2 folds into the rows (no causal mask: both queries see the whole sequence)."""
    lens = torch.tensor([1, 64, 200, 3000], dtype=torch.int32)
    q, kv, lens, _ = make_case(4, 2, 64, 576, 3000, dtype=torch.bfloat16, lens=lens)
    check_against_reference(q, kv, lens, None, 40)
    cache, table = flashmla_pages(kv, lens)
    check_against_reference(q, cache, lens, table, 40)


@pytest.mark.gpu
@needs_tilelang
@pytest.mark.parametrize("num_splits", [1, 4], ids=["single-pass", "split4"])
def test_gpu_graph_replay(num_splits):
    """A captured call (check_seqlens=False: nothing read back) equals the eager one and follows new inputs."""
    lens = torch.tensor([100, 2000], dtype=torch.int32)
    q, kv, lens, _ = make_case(2, 1, 128, 576, 2000, dtype=torch.bfloat16, lens=lens)
    cache, table = flashmla_pages(kv, lens)
    check_graph_replay(lambda: mla_decode_tilelang(q, cache, table, lens, num_splits=num_splits,
                                                   check_seqlens=False), q)


# ---------------------------------------------------------------------------------- CPU
def test_module_imports_without_tilelang():
    """In a process where `import tilelang` fails, the module imports and the entry says what it needs."""
    code = ("import sys; sys.modules['tilelang'] = None\n"
            "import torch\n"
            "from attention_kernels.mla import mla_decode_tilelang\n"
            "q = torch.randn(1, 1, 16, 576, dtype=torch.bfloat16)\n"
            "kv = torch.randn(1, 64, 576, dtype=torch.bfloat16)\n"
            "try:\n"
            "    mla_decode_tilelang(q, kv, None, torch.tensor([64], dtype=torch.int32))\n"
            "except RuntimeError as e:\n"
            "    print('RuntimeError:', e)\n")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=root,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RuntimeError: mla_decode_tilelang needs TileLang" in done.stdout


def _args(paged=True):
    """A good call on CPU tensors (bf16, DeepSeek's dims, pages of 64)."""
    B, T = 2, 100
    q = torch.randn(B, 1, 16, 576, dtype=torch.bfloat16)
    kv = torch.randn(B, T, 576, dtype=torch.bfloat16)
    lens = torch.tensor([5, T], dtype=torch.int32)
    table = None
    if paged:
        kv, table = flashmla_pages(kv, lens)
    return {"q": q, "kv_cache": kv, "block_table": table, "cache_seqlens": lens}


def _change(**how):
    def mutate(args):
        for name, make in how.items():
            args[name] = make(args)
    return mutate


BAD_CASES = [
    Case("q-float32", _change(q=lambda a: a["q"].float(), kv_cache=lambda a: a["kv_cache"].float()), TypeError,
         "q has dtype float32; supported: bfloat16, float16"),
    Case("q-float64", _change(q=lambda a: a["q"].double(), kv_cache=lambda a: a["kv_cache"].double()), TypeError,
         "q has dtype float64"),
    Case("D_qk-512", _change(q=lambda a: a["q"][..., :512], kv_cache=lambda a: a["kv_cache"][..., :512]),
         ValueError, "built for D_qk = 576"),
    Case("head_dim_v-256", _change(head_dim_v=lambda a: 256), ValueError, "head_dim_v = 512"),
    Case("head_dim_v-too-big", _change(head_dim_v=lambda a: 600), ValueError, "head_dim_v must be in"),
    Case("page-size-16", _change(kv_cache=lambda a: a["kv_cache"].reshape(-1, 16, 576),
                                 block_table=lambda a: torch.zeros(2, 28, dtype=torch.int32)),
         ValueError, "kv_cache: .*page size must be a multiple of 64, got 16"),
    Case("block_table-int64", _change(block_table=lambda a: a["block_table"].long()), TypeError,
         "block_table has dtype int64"),
    Case("scale-zero", _change(softmax_scale=lambda a: 0.0), ValueError, "softmax_scale must be finite and > 0"),
    Case("q-requires-grad", _change(q=lambda a: a["q"].requires_grad_()), ValueError,
         "q requires grad, and mla_decode has no backward"),
    Case("num_splits-zero", _change(num_splits=lambda a: 0), ValueError, "num_splits must be in"),
    Case("num_splits-float", _change(num_splits=lambda a: 2.0), TypeError, "num_splits must be an int"),
    Case("check_seqlens-int", _change(check_seqlens=lambda a: 1), TypeError, "check_seqlens must be a bool"),
]


@pytest.mark.parametrize("case", bad_input_cases(["q", "kv_cache", "cache_seqlens", "block_table"], kernel=False,
                                                 float_tensors=["q", "kv_cache"]) + BAD_CASES, ids=case_id)
def test_refuses_bad_input_before_asking_for_tilelang(case, monkeypatch):
    monkeypatch.setattr(peers, "tilelang", lambda: None)   # refusals come first: the same on every machine
    expect_refusal(mla_decode_tilelang, _args, case)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_good_input_without_tilelang_says_it_is_needed(paged, monkeypatch):
    monkeypatch.setattr(peers, "tilelang", lambda: None)
    with pytest.raises(RuntimeError, match="needs TileLang"):
        mla_decode_tilelang(**_args(paged))


@pytest.mark.skipif(ON_GPU, reason="a CUDA machine takes CPU tensors nowhere: nothing to check")
def test_cpu_tensors_are_refused_where_tilelang_is_installed(monkeypatch):
    monkeypatch.setattr(peers, "tilelang", lambda: object())
    with pytest.raises(ValueError, match="q is on cpu: the TileLang kernels run on a CUDA GPU"):
        mla_decode_tilelang(**_args())


def _decode_contract(rows, split, dtype):
    """`_decode_kernel`'s contract in PyTorch: the same arguments, slices and outputs."""
    def run(q, kv, table, seqlens, page, scale_log2, o, lse):
        num_splits = o.shape[2]
        assert split == (num_splits > 1)
        for b in range(q.shape[0]):
            n = int(seqlens[b])
            slice_len = math.ceil(math.ceil(n / num_splits) / 64) * 64
            for s in range(num_splits):
                start, end = s * slice_len, min((s + 1) * slice_len, n)
                if start >= end:
                    o[b, :, s], lse[b, :, s] = 0, -math.inf
                    continue
                t = torch.arange(start, end, device=kv.device)
                keys = kv[table[b, t // page].long() * page + t % page].float()
                scores = q[b].float() @ keys.T * scale_log2
                m = scores.max(-1).values
                p = torch.exp2(scores - m[:, None])
                o[b, :, s] = (p @ keys[:, :512] / p.sum(-1)[:, None]).to(o.dtype)
                lse[b, :, s] = (torch.log2(p.sum(-1)) + m) * (math.log(2) if num_splits == 1 else 1.0)
    return run


def _merge_contract(rows, dtype):
    """`_merge_kernel`'s contract in PyTorch."""
    def run(o_part, lse_part, out, lse):
        m = lse_part.max(-1, keepdim=True).values
        w = torch.exp2(lse_part - m)
        out.copy_((o_part * (w / w.sum(-1, keepdim=True))[..., None]).sum(2))
        lse.copy_((torch.log2(w.sum(-1)) + m[..., 0]) * math.log(2))
    return run


@pytest.mark.parametrize("num_splits", [1, 3], ids=["single-pass", "split3"])
@pytest.mark.parametrize("paged, s_q", [(False, 1), (True, 1), (True, 2)], ids=["dense", "paged", "paged-sq2"])
def test_plumbing_with_the_kernels_as_pytorch(paged, s_q, num_splits, monkeypatch):
    """Everything around the kernels (the identity table of a dense cache, the row layouts, the lse layout
    [B, H, s_q], the partials handed to the merge), with each kernel replaced by its contract in PyTorch."""
    contracts = {tilelang_decode._decode_kernel: _decode_contract, tilelang_decode._merge_kernel: _merge_contract}
    monkeypatch.setattr(tilelang_decode, "_compiled", lambda build, *key: contracts[build](*key))
    lens = torch.tensor([1, 130, 200], dtype=torch.int32)
    q, kv, lens, _ = make_case(3, s_q, 4, 576, 200, dtype=torch.float16, lens=lens)
    table = None
    if paged:
        kv, table = flashmla_pages(kv, lens)
    out, lse = tilelang_decode.launch_tilelang(q, kv, table, lens, 0.1, num_splits)
    ref, ref_lse = mla_decode_ref(q, kv, table, lens, 512, 0.1)
    assert_close(out, ref, tolerance(torch.float16))
    assert (lse - ref_lse).abs().max().item() < 1e-4


@needs_tilelang
def test_kernels_compile_for_hopper():
    """No GPU needed (nvcc is): both kernels lower and compile for sm_90a without spills, within shared memory."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "mla_tilelang_compile.py"
    done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
