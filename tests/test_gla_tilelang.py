"""The TileLang GLA chunk kernels (attention_kernels/gla/tilelang_chunk.py) against the fp64 loop
(attention_kernels/gla/reference.py).

GPU (marked `gpu`, skipped without CUDA, and without TileLang): bf16 and fp16, K and V of 64 and 128,
lengths that end mid-chunk (one token short of a chunk, one past), B and H above 1, with and without an
initial state, the paper's gates, strong ones (down to e^-5 a step) and none; resets (-inf gates) at a
chunk start and mid-chunk; a NaN in v reaching exactly the rows after it.
CPU (always): the module imports without TileLang, the entry refuses bad input (requiring grad included)
before it asks for TileLang, says TileLang is needed when it is missing, and its plumbing (the chunk
states handed from one kernel to the other, the zero initial state, the final state) is right with the
two kernels replaced by PyTorch versions of their contracts.
"""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from input_cases import Case, bad_input_cases, case_id, expect_refusal
from linear_cases import linear_input_cases, linear_kernel_cases, replace

from attention_kernels import peers
from attention_kernels.common import DEVICE, ON_GPU, assert_close, tolerance
from attention_kernels.gla import chunk_gla_tilelang, naive_recurrent_gla, tilelang_chunk
from attention_kernels.linear import CHUNK

needs_tilelang = pytest.mark.skipif(peers.tilelang() is None, reason="needs TileLang (pip install tilelang)")


def make(B, T, H, K, V, gate, dtype, device):
    """q, k, v, g in dtype (g fp32: the paper's gate is computed in fp32) and an fp32 initial state."""
    q, k = (torch.randn(B, T, H, K, device=device).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device).to(dtype)
    if gate == "paper":
        g = F.logsigmoid(torch.randn(B, T, H, K, device=device)) / 16
    elif gate == "strong":
        g = -5 * torch.rand(B, T, H, K, device=device)
    else:
        g = torch.zeros(B, T, H, K, device=device)
    return q, k, v, g, torch.randn(B, H, K, V, device=device)


def reference(q, k, v, g, h0):
    """The fp64 loop: o (fp64) and the final state."""
    o, S = naive_recurrent_gla(q.double(), k.double(), v.double(), g.double(),
                               initial_state=None if h0 is None else h0.double(), output_final_state=True)
    return o, S


# ---------------------------------------------------------------------------------- GPU
def sid(s):
    B, T, H, K, V = s
    return f"B{B}-T{T}-H{H}-K{K}-V{V}"


GPU_SHAPES = [(1, 63, 1, 64, 64), (2, 65, 3, 128, 128), (2, 1000, 4, 64, 128), (3, 517, 2, 128, 64)]
GPU_CASES = ([(torch.bfloat16, s, g) for s in GPU_SHAPES for g in ("paper", "strong", "none")]
             + [(torch.float16, s, "paper") for s in GPU_SHAPES])


@pytest.mark.gpu
@needs_tilelang
@pytest.mark.parametrize("initial", [True, False], ids=["h0", "no-h0"])
@pytest.mark.parametrize("dtype, shape, gate", GPU_CASES, ids=[f"{str(d)[6:]}-{sid(s)}-{g}" for d, s, g in GPU_CASES])
def test_gpu_matches_reference(dtype, shape, gate, initial):
    q, k, v, g, h0 = make(*shape, gate, dtype, "cuda")
    h0 = h0 if initial else None
    o_ref, S_ref = reference(q, k, v, g, h0)
    o, S = chunk_gla_tilelang(q, k, v, g, initial_state=h0, output_final_state=True)
    assert o.dtype == dtype and o.shape == o_ref.shape and S.dtype == torch.float32 and S.shape == S_ref.shape
    assert not o.isnan().any() and not S.isnan().any()
    assert_close(o, o_ref, tolerance(dtype), "o")
    assert_close(S, S_ref, tolerance(dtype), "final state")
    o_alone, none = chunk_gla_tilelang(q, k, v, g, initial_state=h0)
    assert none is None and torch.equal(o_alone, o)


@pytest.mark.gpu
@needs_tilelang
@pytest.mark.xfail(strict=True, reason="a NaN in v reaches the earlier rows of its chunk through A V (0 * NaN): "
                                       "the Triton form's dot_causal guard is not in the TileLang kernel yet")
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.bfloat16], ids=["g-fp32", "g-bf16"])
def test_gpu_resets_and_poison(gate_dtype):
    """bf16 at a real size: a reset (-inf) at a chunk start and mid-chunk, a NaN in head 3's v at token 1500,
    which reaches head 3's rows from 1500 on and nothing else."""
    q, k, v, g, h0 = make(2, 2048, 8, 128, 128, "paper", torch.bfloat16, "cuda")
    g[:, [CHUNK * 5, 1000]] = -math.inf
    g = g.to(gate_dtype)
    v[:, 1500, 3] = math.nan
    clean = v.clone()
    clean[:, 1500, 3] = 0
    o_ref, _ = reference(q, k, clean, g, h0)
    o, _ = chunk_gla_tilelang(q, k, v, g, initial_state=h0)
    poisoned = torch.zeros_like(o, dtype=torch.bool)
    poisoned[:, 1500:, 3] = True
    assert torch.equal(~torch.isfinite(o), poisoned)
    assert_close(o[:, :1500], o_ref[:, :1500], tolerance(torch.bfloat16), "o before the NaN")


# ---------------------------------------------------------------------------------- CPU
def test_module_imports_without_tilelang():
    """In a process where `import tilelang` fails, the module imports and the entry says what it needs."""
    code = ("import sys; sys.modules['tilelang'] = None\n"
            "import torch\n"
            "from attention_kernels.gla import chunk_gla_tilelang\n"
            "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
            "q, k, v, g = torch.randn(4, 1, 70, 2, 64, dtype=torch.float16, device=device).unbind(0)\n"
            "try:\n"
            "    chunk_gla_tilelang(q, k, v, -g.abs())\n"
            "except RuntimeError as e:\n"
            "    print('RuntimeError:', e)\n")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=root,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RuntimeError: chunk_gla_tilelang needs TileLang" in done.stdout


def _small():
    """A call the shared checks judge (q, k [1, 8, 2, 16], v [1, 8, 2, 12]: linear_input_cases' shapes)."""
    q, k, v, g, h0 = make(1, 8, 2, 16, 12, "paper", torch.float32, DEVICE)
    return dict(q=q, k=k, v=v, g=g, initial_state=h0, output_final_state=True)


def _good():
    """A call the TileLang kernels take (fp16, K = V = 64), on this machine's device."""
    q, k, v, g, h0 = make(2, 70, 2, 64, 64, "paper", torch.float16, DEVICE)
    return dict(q=q, k=k, v=v, g=g, initial_state=h0, output_final_state=True)


SHARED_CASES = (bad_input_cases(["q", "k", "v", "g", "initial_state"], float_tensors=["q", "k", "v", "g"])
                + linear_input_cases(token_tensors=("q", "k", "v", "g"), key_tensors=("q", "k", "g"))
                + linear_kernel_cases(key_tensors=("q", "k", "g")))
TILELANG_CASES = [
    Case("fp32-inputs", replace(**{n: (lambda a, n=n: a[n].float()) for n in ("q", "k", "v")}), TypeError,
         "q has dtype float32; supported: bfloat16, float16"),
    Case("K-32", replace(**{n: (lambda a, n=n: a[n][..., :32]) for n in ("q", "k", "g")},
                         initial_state=lambda a: a["initial_state"][:, :, :32]),
         ValueError, r"built for head dims K, V in \(64, 128\), got K=32, V=64"),
    Case("V-96", replace(v=lambda a: torch.cat([a["v"], a["v"][..., :32]], -1), initial_state=lambda a: None),
         ValueError, "got K=64, V=96"),
    Case("cu_seqlens", replace(cu_seqlens=lambda a: torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE)), ValueError,
         "cu_seqlens must be None"),
] + [
    Case(f"{name}-requires-grad", replace(**{name: (lambda a, name=name: a[name].clone().requires_grad_())}),
         ValueError, f"{name} requires grad, and chunk_gla_tilelang has no backward")
    for name in ("q", "k", "v", "g", "initial_state")
]


@pytest.mark.parametrize("case", SHARED_CASES, ids=case_id)
def test_refuses_what_every_chunk_form_refuses(case, monkeypatch):
    monkeypatch.setattr(peers, "tilelang", lambda: None)   # refusals come first: the same on every machine
    expect_refusal(chunk_gla_tilelang, _small, case)


@pytest.mark.parametrize("case", TILELANG_CASES, ids=case_id)
def test_refuses_what_the_tilelang_kernels_do_not_take(case, monkeypatch):
    monkeypatch.setattr(peers, "tilelang", lambda: None)
    expect_refusal(chunk_gla_tilelang, _good, case)


def test_grad_is_refused_only_in_grad_mode(monkeypatch):
    """Under torch.no_grad() an input that requires grad is read as a value: the call goes on (here to the
    missing-TileLang error)."""
    monkeypatch.setattr(peers, "tilelang", lambda: None)
    args = _good()
    args["q"].requires_grad_()
    with torch.no_grad(), pytest.raises(RuntimeError, match="needs TileLang"):
        chunk_gla_tilelang(**args)


def test_good_input_without_tilelang_says_it_is_needed(monkeypatch):
    monkeypatch.setattr(peers, "tilelang", lambda: None)
    with pytest.raises(RuntimeError, match="chunk_gla_tilelang needs TileLang"):
        chunk_gla_tilelang(**_good())


@pytest.mark.skipif(ON_GPU, reason="a CUDA machine takes CPU tensors nowhere: nothing to check")
def test_cpu_tensors_are_refused_where_tilelang_is_installed(monkeypatch):
    monkeypatch.setattr(peers, "tilelang", lambda: object())
    with pytest.raises(ValueError, match="q is on cpu: the TileLang kernels run on a CUDA GPU"):
        chunk_gla_tilelang(**_good())


def _cumulative_gates(g, t0, n):
    """The in-chunk cumulative gates of tokens t0 .. t0 + n - 1 (fp32), floored as the kernels floor them."""
    return g[:, t0:t0 + n].float().clamp(min=-110.0).cumsum(1)


def _state_contract(K, V, dtype, gate_dtype):
    """`_state_kernel`'s contract in PyTorch: the same arguments and outputs, chunk by chunk."""
    def run(k, v, g, h0, states, ht):
        S = h0.clone()
        for i_t in range(states.shape[1]):
            t0 = i_t * CHUNK
            states[:, i_t] = S.to(states.dtype)
            kc, vc = k[:, t0:t0 + CHUNK].float(), v[:, t0:t0 + CHUNK].float()
            b = _cumulative_gates(g, t0, kc.shape[1])
            decayed = kc * (b[:, -1:] - b).exp()
            S = b[:, -1, :, :, None].exp() * S + torch.einsum("bthk,bthv->bhkv", decayed, vc)
        ht.copy_(S)
    return run


def _output_contract(K, V, dtype, gate_dtype):
    """`_output_kernel`'s contract in PyTorch."""
    def run(q, k, v, g, states, scale, o):
        for i_t in range(states.shape[1]):
            t0 = i_t * CHUNK
            qc, kc, vc = (x[:, t0:t0 + CHUNK].float() for x in (q, k, v))
            n = qc.shape[1]
            b = _cumulative_gates(g, t0, n)
            inter = torch.einsum("bthk,bhkv->bthv", qc * b.exp(), states[:, i_t].float())
            exponent = b[:, :, None] - b[:, None, :]                        # [B, t, j, H, K]
            causal = torch.ones(n, n, dtype=torch.bool).tril()[None, :, :, None, None]
            decay = torch.where(causal, exponent, -math.inf).exp()
            A = torch.einsum("bthk,bjhk,btjhk->bhtj", qc, kc, decay)
            o[:, t0:t0 + CHUNK] = (scale * (inter + torch.einsum("bhtj,bjhv->bthv", A, vc))).to(o.dtype)
    return run


@pytest.mark.parametrize("initial", [True, False], ids=["h0", "no-h0"])
@pytest.mark.parametrize("final", [True, False], ids=["final", "no-final"])
def test_plumbing_with_the_kernels_as_pytorch(initial, final, monkeypatch):
    """Everything around the kernels (the chunk states' buffer and dtype, the zero initial state, the final
    state returned or not), with each kernel replaced by its contract in PyTorch, against the fp64 loop."""
    contracts = {tilelang_chunk._state_kernel: _state_contract, tilelang_chunk._output_kernel: _output_contract}
    monkeypatch.setattr(tilelang_chunk, "_compiled", lambda build, *key: contracts[build](*key))
    q, k, v, g, h0 = make(2, 150, 2, 64, 128, "strong", torch.float16, "cpu")
    h0 = h0 if initial else None
    o, S = tilelang_chunk.launch_tilelang(q, k, v, g, 64 ** -0.5, h0, final)
    o_ref, S_ref = reference(q, k, v, g, h0)
    assert o.dtype == torch.float16 and (S is not None) == final
    assert_close(o, o_ref, tolerance(torch.float16), "o")
    if final:
        assert_close(S, S_ref, tolerance(torch.float16), "final state")


@needs_tilelang
def test_kernels_compile_for_hopper():
    """No GPU needed (nvcc is): both kernels lower and compile for sm_90a without spills, within shared memory."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "gla_tilelang_compile.py"
    done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
