"""The book's kernels inside model code people already use: a tiny transformers Llama (GQA, 4 query heads
on 2 KV heads, 2 layers, random fp32 weights, CPU) whose attention is `flash_attn_func`, registered with
transformers' AttentionInterface, against the same model on PyTorch's SDPA: logits, every parameter's
gradient, and greedy generation with a KV cache, token for token. On a GPU the same comparison runs in bf16 at
the head dims the GPU kernels take (64, 128), 3 layers. transformers is a test requirement (requirements.txt);
the test is skipped where it is absent. Its releases 5.x bring Hugging Face's `kernels` package along: the
book's package is `attention_kernels`, so the two live side by side.
"""
import contextlib
import copy

import pytest
import torch

import attention_kernels  # noqa: F401  (before transformers, which imports Triton: see conftest)
from attention_kernels.common import rel_err, tolerance
from attention_kernels.flash_attn.hf_attention import book_attention

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")

IMPLEMENTATION = "book_attention"  # (a name with "flash" in it would send transformers to its own flash-attn path)

transformers.AttentionInterface.register(IMPLEMENTATION, book_attention)
# the mask transformers builds for flash-attn: None unless a token is padding
masking_utils.AttentionMaskInterface.register(IMPLEMENTATION, masking_utils.flash_attention_mask)


def _models(hidden_size=64, head_dim=32, layers=2, vocab_size=128, positions=64, device="cpu", dtype=torch.float32):
    """(the model on SDPA, the same weights on the book's kernel): GQA, 4 query heads on 2 KV heads, weights
    drawn in fp32 on the CPU (the test's seed), then moved to `device` and `dtype`."""
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=head_dim,   # the default would be hidden_size / 4
                                      max_position_embeddings=positions, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None, attn_implementation="sdpa")
    sdpa = transformers.LlamaForCausalLM(config).float().to(device=device, dtype=dtype)
    book = copy.deepcopy(sdpa)
    book.set_attn_implementation(IMPLEMENTATION)
    assert sdpa.config._attn_implementation == "sdpa" and book.config._attn_implementation == IMPLEMENTATION
    return sdpa, book


@contextlib.contextmanager
def _recorded_calls():
    """While open, the book's attention is registered so that each call records (query length, key length) in
    the list it yields: a model that never called the book would compare SDPA with itself."""
    calls = []

    def recording(module, query, key, *args, **kwargs):
        calls.append((query.shape[2], key.shape[2]))
        return book_attention(module, query, key, *args, **kwargs)

    transformers.AttentionInterface.register(IMPLEMENTATION, recording)
    try:
        yield calls
    finally:
        transformers.AttentionInterface.register(IMPLEMENTATION, book_attention)


def _logits_and_gradients(model, ids):
    """The logits on ids, and every parameter's gradient (by name) of the next-token cross-entropy (in fp32)."""
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    names, params = zip(*model.named_parameters())
    return logits, dict(zip(names, torch.autograd.grad(loss, params)))


def _assert_book_matches_sdpa(sdpa, book, ids, logits_tol, grad_tol):
    """Both models' logits and gradients on ids: the book's finite and within the bounds of SDPA's (relative
    error), the book's attention called once a layer, and the gradients reaching the attention."""
    sdpa_logits, sdpa_grads = _logits_and_gradients(sdpa, ids)
    with _recorded_calls() as calls:
        book_logits, book_grads = _logits_and_gradients(book, ids)
    assert calls == [(ids.shape[1], ids.shape[1])] * book.config.num_hidden_layers
    assert torch.isfinite(book_logits).all()
    err = rel_err(book_logits, sdpa_logits)
    assert err <= logits_tol, f"logits: relative error {err:.2e} > {logits_tol:.0e}"
    assert book_grads.keys() == sdpa_grads.keys()
    for name, want in sdpa_grads.items():
        assert torch.isfinite(book_grads[name]).all(), f"the gradient of {name} holds NaN or inf"
        err = rel_err(book_grads[name], want)
        assert err <= grad_tol, f"gradient of {name}: relative error {err:.2e} > {grad_tol:.0e}"
    assert sdpa_grads["model.layers.0.self_attn.q_proj.weight"].abs().max() > 0   # gradients reach the attention


def test_logits_and_gradients_match_sdpa():
    sdpa, book = _models()
    tol = 10 * tolerance(torch.float32, tf32_dots=True)
    _assert_book_matches_sdpa(sdpa, book, torch.randint(0, 128, (2, 13)), tol, tol)


# Two bf16 runs of one model part at their first differing rounding and drift apart through every bf16 product
# after it, to about as far as each is from the fp32 model. Measured as a stand-in on the CPU (transformers' eager
# attention against its SDPA, both bf16, the models below, seed 0): logits 6.8e-3 (head dim 64) and 7.3e-3
# (128) apart, the worst gradient (a layer's q_proj or k_proj) 1.4e-2 and 1.5e-2. Bounds: 2x and 4x
# tolerance(bf16), the second the peer-layer tests' GRAD_TOL.
GPU_LOGITS_TOL = 2 * tolerance(torch.bfloat16)
GPU_GRAD_TOL = 4 * tolerance(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_logits_and_gradients_match_sdpa_bf16(head_dim):
    """bf16 on the GPU: 3 layers of 4 query heads on 2 KV heads, 2 sequences of 200 tokens (no tile multiple);
    one training step's gradients (next-token cross-entropy on random ids) of every parameter."""
    sdpa, book = _models(hidden_size=4 * head_dim, head_dim=head_dim, layers=3, vocab_size=256, positions=256,
                         device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (2, 200), device="cuda")
    _assert_book_matches_sdpa(sdpa, book, ids, GPU_LOGITS_TOL, GPU_GRAD_TOL)


def test_greedy_generation_with_cache_matches_sdpa():
    """Prefill (T = S) and then one query on a growing cache (T = 1, S = 9, 10, ...): the same tokens."""
    sdpa, book = _models()
    prompt = torch.randint(0, 128, (2, 8))
    with torch.no_grad(), _recorded_calls() as calls:
        want = sdpa.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True)
        got = book.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True)
    assert want.shape == (2, 18) and torch.equal(got, want)
    assert calls[0] == (8, 8) and calls[-1] == (1, 17)   # the cache was used: one new query a step


def test_padding_is_refused():
    _, book = _models()
    ids = torch.randint(0, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    with pytest.raises(ValueError, match="attention mask must be None"):
        book(ids, attention_mask=mask)
