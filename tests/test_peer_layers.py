"""The peers' own layers with the book's op swapped in (on a GPU): fla 0.6's GatedLinearAttention and
KimiDeltaAttention, fla's MultiScaleRetention (a fixed decay per head: Lightning's kernel) and mamba_ssm's
Mamba2 block on its unfused route (use_mem_eff_path=False, which calls mamba_chunk_scan_combined).

Each layer is built small (bf16 on the GPU, a fixed seed) and run twice on the same input: once as the peer
ships it, once with the name its module looks up rebound to the book's function (monkeypatch), so the
layer's own code makes its own call into the book. The outputs, and after one backward of a scalar loss the
input's and every parameter's gradient, must agree within bf16's rounding; a counter around the book's
function checks that the layer really called it. The decode tests prefill a prompt into the layer's cache,
then take one step (the recurrent form), and compare the outputs and the cached states. One test runs on
the CPU too: the retention adapter against the Lightning loop.

The calls, as the layers make them (fla 0.6.0, fla/layers/*.py; mamba_ssm at e9594ce, modules/mamba2.py):
    GatedLinearAttention  chunk_gla(q=, k=, v=, g=, initial_state=, output_final_state=, state_v_first=True,
                          cu_seqlens=None); T <= 64 takes fused_recurrent_gla(..., gk=, ...) instead
    KimiDeltaAttention    chunk_kda(q=, k=, v=, g=, beta=, A_log=, dt_bias=, initial_state=,
                          output_final_state=, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                          use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False, safe_gate=False,
                          lower_bound=None, state_v_first=True, cu_seqlens=None); decode:
                          fused_recurrent_kda, the same but safe_gate
    MultiScaleRetention   chunk_retention(q=, k=, v=, initial_state=, output_final_state=, cu_seqlens=None):
                          the book has no retention op, so a small adapter here maps it onto chunk_lightning
                          (retention's decay 1 - 2^(-5-h) per head as slopes, scale 1/sqrt(K)). fla 0.6 has no
                          layer that calls chunk_lightning_attn.
    Mamba2                mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=, D=, z=None, dt_bias=,
                          dt_softplus=True, seq_idx=None, cu_seqlens=None, return_final_states=,
                          return_varlen_states=False) on strided views of one projection; its norm
                          rmsnorm_fn(x, weight, None, z=, eps=, group_size=, norm_before_gate=False); decode:
                          selective_state_update(state, x, dt, A, B, C, D, z=None, dt_bias=, dt_softplus=True)
                          with A, dt, dt_bias and D broadcast over headdim (stride 0)

Skipped, naming why, where a peer does not import: fla's layers need einops and transformers (fla.layers
imports every layer, MultiScaleRetention's transformers.activations among them); mamba_ssm's block needs
mamba_ssm/modules/mamba2.py, mamba_ssm/distributed and huggingface_hub besides the Triton ops.
"""
import importlib
import types

import pytest
import torch

from attention_kernels.common import rel_err

# T > 64 (fla's layers take the recurrent form at T <= 64), and not a multiple of a chunk
B, T, HIDDEN = 2, 100, 128
OUTPUT_TOL = 2e-2       # two bf16 implementations of one op: ||book - peer|| / ||peer||
# A gradient passes the op's rounding on through the layer's bf16 products; fla's own layer tests hold two
# runs of one layer to 4e-2 on the input's gradient (tests/layers/test_kda_layer_graph.py)
GRAD_TOL = 4e-2


def _fla_layer_module(name: str):
    """fla.layers.<name>, or a skip naming what is missing."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        return importlib.import_module(f"fla.layers.{name}")
    except ImportError as error:
        pytest.skip(f"fla.layers.{name} does not import here ({error}): fla's layers need fla 0.6, einops "
                    "and transformers")


def _mamba2_module():
    """mamba_ssm.modules.mamba2 (MAMBA_SSM_PATH's checkout on the path, as for the Triton ops), or a skip."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from attention_kernels import peers

    if peers.mamba_ssm("ssd_combined", "mamba_chunk_scan_combined") is None:
        pytest.skip("mamba_ssm's Triton ops do not import here (MAMBA_SSM_PATH names the checkout)")
    try:
        return importlib.import_module("mamba_ssm.modules.mamba2")
    except Exception as error:       # any failure of the block's own imports
        pytest.skip(f"mamba_ssm's Mamba2 block does not import here ({type(error).__name__}: {error}): it needs "
                    "mamba_ssm/modules/mamba2.py and mamba_ssm/distributed of the ops' commit, and huggingface_hub")


class Counted:
    """A function that counts its calls: the swap must reach the book (a layer that never made the call would
    compare the peer with itself)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _swap(monkeypatch, swaps) -> dict:
    """Rebind, for each (module, {name: book function}) of swaps, the module's name to the book's function,
    counted; returns {name: Counted}."""
    counted = {}
    for module, functions in swaps:
        for name, fn in functions.items():
            assert hasattr(module, name), f"{module.__name__} no longer looks up {name}"
            counted[name] = Counted(fn)
            monkeypatch.setattr(module, name, counted[name])
    return counted


def _assert_called(counted: dict, what: str) -> None:
    missed = [name for name, c in counted.items() if c.calls == 0]
    assert not missed, f"{what}: the layer never called the book's {missed}"


def _forward_backward(layer, x, probe, call):
    """The layer's output on x (call(layer, x) -> output) and the gradients of sum(output * probe) to x and
    to every parameter, by name."""
    x = x.detach().clone().requires_grad_()
    out = call(layer, x)
    names, params = zip(*layer.named_parameters())
    grads = torch.autograd.grad((out.float() * probe).sum(), (x, *params), allow_unused=True)
    return out.detach(), dict(zip(("input", *names), grads))


def _assert_same_layer(peer, book, what):
    """The book's (output, gradients) against the peer's: finite, within bf16 tolerance, the same names."""
    (out_peer, grads_peer), (out_book, grads_book) = peer, book
    assert torch.isfinite(out_book).all(), f"{what}: the book's output holds NaN or inf"
    err = rel_err(out_book, out_peer)
    assert err <= OUTPUT_TOL, f"{what} output: relative error {err:.2e} > {OUTPUT_TOL:.0e}"
    assert grads_book.keys() == grads_peer.keys()
    for name, want in grads_peer.items():
        got = grads_book[name]
        assert (got is None) == (want is None), f"{what}: the gradient of {name} reaches one run only"
        if want is None:
            continue
        err = rel_err(got, want)
        assert err <= GRAD_TOL, f"{what} gradient of {name}: relative error {err:.2e} > {GRAD_TOL:.0e}"
    assert grads_peer["input"].abs().max() > 0


def _compare(monkeypatch, make_layer, swaps, call, what):
    """Build the layer (seed 0), run it with the peer's ops, then with the book's swapped in; compare."""
    torch.manual_seed(0)
    layer = make_layer()
    x = torch.randn(B, T, HIDDEN, device="cuda", dtype=torch.bfloat16)
    probe = torch.randn(B, T, HIDDEN, device="cuda")
    peer = _forward_backward(layer, x, probe, call)
    with monkeypatch.context() as patch:
        counted = _swap(patch, swaps)
        book = _forward_backward(layer, x, probe, call)
    _assert_called(counted, what)
    _assert_same_layer(peer, book, what)


class StateCache:
    """The part of fla's Cache a layer touches (len, [layer_idx], update, get_seq_length): one layer's states,
    without transformers' cache classes, whose versions move."""

    def __init__(self):
        self.layers, self.seen = [], 0

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, layer_idx):
        return self.layers[layer_idx]

    def update(self, layer_idx=0, recurrent_state=None, conv_state=None, offset=1, **_):
        while len(self.layers) <= layer_idx:
            self.layers.append({"recurrent_state": None, "attn_state": None, "conv_state": None, "ffn_state": None})
        state = self.layers[layer_idx]
        if recurrent_state is not None:
            state["recurrent_state"] = recurrent_state
        if conv_state is not None:
            state["conv_state"] = conv_state
        self.seen += offset
        return state

    def get_seq_length(self, layer_idx=0):
        return self.seen


def _fla_decode(layer, x):
    """Prefill x[:, :-1] into a fresh cache (T tokens: the chunk form), then one step on x[:, -1:] (the
    recurrent form); returns (prefill output, step output, cached recurrent state)."""
    cache = StateCache()
    with torch.no_grad():
        prefill = layer(x[:, :-1], past_key_values=cache, use_cache=True)[0]
        step = layer(x[:, -1:], past_key_values=cache, use_cache=True)[0]
    return prefill, step, cache[0]["recurrent_state"]


def _compare_decode(monkeypatch, make_layer, swaps, decode, what):
    """Build the layer (seed 0, eval), decode (decode(layer, x) -> (prefill, step, state)) with the peer's
    ops, then with the book's swapped in; compare the three."""
    torch.manual_seed(0)
    layer = make_layer().eval()
    x = torch.randn(B, T + 1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    peer = decode(layer, x)
    with monkeypatch.context() as patch:
        counted = _swap(patch, swaps)
        book = decode(layer, x)
    _assert_called(counted, what)
    for name, got, want in zip(("prefill", "step", "state"), book, peer):
        assert got.shape == want.shape, f"{what} {name}: shape {tuple(got.shape)}, the peer's {tuple(want.shape)}"
        err = rel_err(got, want)
        assert err <= OUTPUT_TOL, f"{what} {name}: relative error {err:.2e} > {OUTPUT_TOL:.0e}"


# ------------------------------------------------------------------ fla: GLA
def _gla():
    gla = _fla_layer_module("gla")
    return gla, lambda: gla.GatedLinearAttention(mode="chunk", hidden_size=HIDDEN, expand_k=0.5, expand_v=1.0,
                                                 num_heads=2, layer_idx=0).to(device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
def test_fla_gla_layer(monkeypatch):
    from attention_kernels.gla import chunk_gla

    gla, make = _gla()
    _compare(monkeypatch, make, [(gla, {"chunk_gla": chunk_gla})], lambda layer, x: layer(x)[0],
             "GatedLinearAttention")


@pytest.mark.gpu
def test_fla_gla_layer_decode(monkeypatch):
    from attention_kernels.gla import chunk_gla, fused_recurrent_gla

    gla, make = _gla()
    _compare_decode(monkeypatch, make, [(gla, {"chunk_gla": chunk_gla, "fused_recurrent_gla": fused_recurrent_gla})],
                    _fla_decode, "GatedLinearAttention")


# ------------------------------------------------------------------ fla: KDA (Kimi Linear)
def _kda():
    kda = _fla_layer_module("kda")
    return kda, lambda: kda.KimiDeltaAttention(hidden_size=HIDDEN, head_dim=64, num_heads=2, mode="chunk",
                                               use_short_conv=True, layer_idx=0).to(device="cuda",
                                                                                    dtype=torch.bfloat16)


@pytest.mark.gpu
def test_fla_kda_layer(monkeypatch):
    from attention_kernels.kda import chunk_kda

    kda, make = _kda()
    _compare(monkeypatch, make, [(kda, {"chunk_kda": chunk_kda})], lambda layer, x: layer(x)[0], "KimiDeltaAttention")


@pytest.mark.gpu
def test_fla_kda_layer_decode(monkeypatch):
    from attention_kernels.kda import chunk_kda, fused_recurrent_kda

    kda, make = _kda()
    _compare_decode(monkeypatch, make, [(kda, {"chunk_kda": chunk_kda, "fused_recurrent_kda": fused_recurrent_kda})],
                    _fla_decode, "KimiDeltaAttention")


# ------------------------------------------------------------------ fla: RetNet's retention on Lightning's kernel
def retention_slopes(H: int, device="cpu") -> torch.Tensor:
    """Retention's decay per step on head h is 1 - 2^(-5-h) (fla.ops.retention): as Lightning's slopes, its
    negative log, fp32 [H]."""
    return -torch.log1p(-torch.exp2(-5.0 - torch.arange(H, dtype=torch.float64))).float().to(device)


def retention_on(book_fn):
    """fla's chunk_retention / fused_recurrent_retention call (q, k, v, scale=None, initial_state=None,
    output_final_state=False, cu_seqlens=None; scale 1/sqrt(K) by default) onto one of the book's
    Lightning forms."""
    def retention(q, k, v, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, **options):
        if options:
            raise TypeError(f"an option this adapter does not map: {sorted(options)}")
        return book_fn(q, k, v, retention_slopes(q.shape[2], q.device),
                       scale=q.shape[-1] ** -0.5 if scale is None else scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    return retention


def _retention():
    retnet = _fla_layer_module("multiscale_retention")
    return retnet, lambda: retnet.MultiScaleRetention(mode="chunk", hidden_size=HIDDEN, num_heads=2,
                                                      layer_idx=0).to(device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
def test_fla_retention_layer_on_lightning(monkeypatch):
    from attention_kernels.lightning import chunk_lightning

    retnet, make = _retention()
    _compare(monkeypatch, make, [(retnet, {"chunk_retention": retention_on(chunk_lightning)})],
             lambda layer, x: layer(x)[0], "MultiScaleRetention")


@pytest.mark.gpu
def test_fla_retention_layer_on_lightning_decode(monkeypatch):
    from attention_kernels.lightning import chunk_lightning, fused_recurrent_lightning

    retnet, make = _retention()
    swaps = [(retnet, {"chunk_retention": retention_on(chunk_lightning),
                       "fused_recurrent_retention": retention_on(fused_recurrent_lightning)})]
    _compare_decode(monkeypatch, make, swaps, _fla_decode, "MultiScaleRetention")


def test_retention_adapter_is_lightning_with_retention_decay():
    # CPU too: the adapter's slopes are fla's decay (log(1 - 2^(-5-h)), as fla writes it), and its call is the
    # Lightning loop with them and scale 1/sqrt(K)
    from attention_kernels.common import DEVICE, assert_close, tolerance
    from attention_kernels.lightning import chunk_lightning, naive_recurrent_lightning

    H, K, V = 3, 16, 32
    fla_log_decay = (1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float64))).log()
    assert torch.allclose(-retention_slopes(H).double(), fla_log_decay, rtol=1e-6, atol=0)
    q, k = (torch.randn(1, 37, H, K, device=DEVICE) for _ in range(2))
    v = torch.randn(1, 37, H, V, device=DEVICE)
    o, ht = retention_on(chunk_lightning)(q=q, k=k, v=v, initial_state=None, output_final_state=True, cu_seqlens=None)
    o_ref, ht_ref = naive_recurrent_lightning(q.double(), k.double(), v.double(), retention_slopes(H).double(),
                                              scale=K ** -0.5, output_final_state=True)
    assert_close(o, o_ref, tolerance(torch.float32), "o")
    assert_close(ht, ht_ref, tolerance(torch.float32), "final_state")
    with pytest.raises(TypeError, match="reverse"):
        retention_on(chunk_lightning)(q, k, v, reverse=True)


# ------------------------------------------------------------------ mamba_ssm: the Mamba2 block
def _mamba2(chunk_size):
    mamba2 = _mamba2_module()
    return mamba2, lambda: mamba2.Mamba2(d_model=HIDDEN, d_state=64, headdim=32, expand=2, chunk_size=chunk_size,
                                         use_mem_eff_path=False, layer_idx=0, device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [64, 256])
@pytest.mark.parametrize("swap", ["scan", "scan+norm"])
def test_mamba_ssm_mamba2_block(monkeypatch, chunk_size, swap):
    from attention_kernels.mamba2 import mamba_chunk_scan_combined, rmsnorm_fn

    mamba2, make = _mamba2(chunk_size)
    swaps = [(mamba2, {"mamba_chunk_scan_combined": mamba_chunk_scan_combined})]
    if swap == "scan+norm":
        # the block's norm (RMSNormGated) looks rmsnorm_fn up in its own module, mamba_ssm's layernorm_gated
        swaps.append((importlib.import_module(mamba2.RMSNormGated.__module__), {"rmsnorm_fn": rmsnorm_fn}))
    _compare(monkeypatch, make, swaps, lambda layer, x: layer(x), f"Mamba2 (chunk {chunk_size}, {swap})")


def _mamba2_decode(layer, x):
    """Prefill x[:, :-1] with inference_params (the scan returns its final state into the cache), then one
    step on x[:, -1:] (selective_state_update). The cache is the block's allocate_inference_cache in fp32:
    the book's step keeps its state in fp32 and refuses a bf16 one."""
    params = types.SimpleNamespace(seqlen_offset=0, key_value_memory_dict={
        layer.layer_idx: layer.allocate_inference_cache(x.shape[0], x.shape[1], dtype=torch.float32)})
    with torch.no_grad():
        prefill = layer(x[:, :-1], inference_params=params)
        params.seqlen_offset = x.shape[1] - 1
        step = layer(x[:, -1:], inference_params=params)
    return prefill, step, params.key_value_memory_dict[layer.layer_idx][1]


@pytest.mark.gpu
def test_mamba_ssm_mamba2_block_decode(monkeypatch):
    from attention_kernels.mamba2 import mamba_chunk_scan_combined, selective_state_update

    mamba2, make = _mamba2(64)
    swaps = [(mamba2, {"mamba_chunk_scan_combined": mamba_chunk_scan_combined,
                       "selective_state_update": selective_state_update})]
    _compare_decode(monkeypatch, make, swaps, _mamba2_decode, "Mamba2")
