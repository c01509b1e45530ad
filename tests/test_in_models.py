"""The book's kernels inside model code people already use: a tiny transformers Llama (GQA, 4 query heads
on 2 KV heads, 2 layers, random fp32 weights, CPU) whose attention is `flash_attn_func`, registered with
transformers' AttentionInterface, against the same model on PyTorch's SDPA: logits, every parameter's
gradient, and greedy generation with a KV cache, token for token. transformers is a test requirement
(requirements.txt); the test is skipped where it is absent. Its releases 5.x bring Hugging Face's `kernels`
package along: the book's package is `attention_kernels`, so the two live side by side.
"""
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


def _models():
    """(the model on SDPA, the same weights on the book's kernel)."""
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=32,   # 64 / 4 = 16 would be the default; the kernel takes 32 and up
                                      max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None, attn_implementation="sdpa")
    sdpa = transformers.LlamaForCausalLM(config).float()
    book = copy.deepcopy(sdpa)
    book.set_attn_implementation(IMPLEMENTATION)
    assert sdpa.config._attn_implementation == "sdpa" and book.config._attn_implementation == IMPLEMENTATION
    return sdpa, book


def test_logits_and_gradients_match_sdpa():
    sdpa, book = _models()
    ids = torch.randint(0, 128, (2, 13))
    results = []
    for model in (sdpa, book):
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        names, params = zip(*model.named_parameters())
        results.append((logits, dict(zip(names, torch.autograd.grad(loss, params)))))
    (logits_sdpa, grads_sdpa), (logits_book, grads_book) = results
    tol = 10 * tolerance(torch.float32, tf32_dots=True)
    assert rel_err(logits_book, logits_sdpa) <= tol
    assert grads_book.keys() == grads_sdpa.keys()
    for name, g in grads_sdpa.items():
        assert torch.isfinite(grads_book[name]).all() and rel_err(grads_book[name], g) <= tol, name
    assert grads_sdpa["model.layers.0.self_attn.q_proj.weight"].abs().max() > 0   # gradients reach the attention


def test_greedy_generation_with_cache_matches_sdpa():
    """Prefill (T = S) and then one query on a growing cache (T = 1, S = 9, 10, ...): the same tokens."""
    sdpa, book = _models()
    prompt = torch.randint(0, 128, (2, 8))
    calls = []
    transformers.AttentionInterface.register(IMPLEMENTATION, lambda m, q, k, *a, **kw: (
        calls.append((q.shape[2], k.shape[2])), book_attention(m, q, k, *a, **kw))[1])
    try:
        with torch.no_grad():
            want = sdpa.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True)
            got = book.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True)
    finally:
        transformers.AttentionInterface.register(IMPLEMENTATION, book_attention)
    assert want.shape == (2, 18) and torch.equal(got, want)
    assert calls[0] == (8, 8) and calls[-1] == (1, 17)   # the cache was used: one new query a step


def test_padding_is_refused():
    _, book = _models()
    ids = torch.randint(0, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    with pytest.raises(ValueError, match="attention mask must be None"):
        book(ids, attention_mask=mask)
