"""tbq eval against llama.cpp's own llama-perplexity (the TurboQuant fork's CPU build in ../shared/llama.cpp).

Same GGUF (the shipped model), same text, context and chunks: the perplexity
of tbq's llama.cpp engine with an f16, q8_0 and q4_0 cache must agree with
``llama-perplexity -ctk T -ctv T -fa on --no-warmup`` to 1e-3 relative. Skipped, with the
reason, where ../shared is absent (users' machines); CI has it. The other
architectures (tiny random checkpoints, :mod:`tbq.hf.arch_compare`) also need
llama.cpp's own converter: ``TBQ_LLAMA_CPP_CONVERTER=.../convert_hf_to_gguf.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import unless_sigill

from tbq.hf.gguf_export import run_llama_perplexity

LLAMA_CPP = Path(__file__).resolve().parents[1].parent / "shared" / "llama.cpp"
PERPLEXITY = LLAMA_CPP / "bin" / "llama-perplexity"

pytestmark = pytest.mark.skipif(
    not PERPLEXITY.exists(), reason=f"llama.cpp's llama-perplexity is not at {PERPLEXITY} (../shared is absent)"
)

CONTEXT, CHUNKS = 512, 4


@pytest.fixture(scope="module")
def shipped():
    from tbq.hf.evaluation import text_tokens
    from tbq.hf.loader import load
    from tbq.hf.shipped import MODEL_DIR, gguf_path

    model, tokenizer = load(gguf_path())
    text = MODEL_DIR / "heldout.txt"
    tokens = text_tokens(tokenizer, text.read_text(encoding="utf-8"), model.config.bos_token_id)
    return model, tokens, gguf_path(), text


def test_tbq_eval_agrees_with_llama_perplexity(shipped):
    from tbq.hf.evaluation import evaluate

    model, tokens, gguf, text = shipped
    res = evaluate(model, tokens, ["q8_0", "q4_0"], context=CONTEXT, chunks=CHUNKS)
    for cache in ("f16", "q8_0", "q4_0"):
        ours = res.row(f"{cache}:{cache}").ppl
        theirs = unless_sigill(run_llama_perplexity, LLAMA_CPP, gguf, text, CONTEXT, CHUNKS, cache_type=cache)["ppl"]
        assert abs(ours / theirs - 1) <= 1e-3, (cache, ours, theirs)


#: The community TurboQuant fork's own build (TheTom/llama-cpp-turboquant at 69d8e4be), for the turbo engine.
LLAMA_CPP_TURBO = Path(__file__).resolve().parents[1].parent / "shared" / "llama.cpp-turbo"


@pytest.mark.skipif(
    not (LLAMA_CPP_TURBO / "bin" / "llama-perplexity").exists(),
    reason=f"the turbo fork's llama-perplexity is not at {LLAMA_CPP_TURBO}/bin (../shared is absent)",
)
def test_turbo_engine_agrees_with_the_forks_llama_perplexity(shipped):
    """``-ctk/-ctv turbo3``, ``turbo4`` and ``q8_0``/``turbo3`` of the fork against ``@turbo``: within 1e-3."""
    from tbq.hf.evaluation import evaluate

    model, tokens, gguf, text = shipped
    pairs = (("turbo3", "turbo3"), ("turbo4", "turbo4"), ("q8_0", "turbo3"))
    res = evaluate(model, tokens, [f"{k}:{v}@turbo" for k, v in pairs], context=CONTEXT, chunks=CHUNKS)
    for k, v in pairs:
        ours = res.row(f"{k}:{v}@turbo").ppl
        theirs = unless_sigill(
            run_llama_perplexity, LLAMA_CPP_TURBO, gguf, text, CONTEXT, CHUNKS, cache_type=k, v_type=v
        )["ppl"]
        assert abs(ours / theirs - 1) <= 1e-3, (k, v, ours, theirs)


#: llama.cpp's convert_hf_to_gguf.py (with its gguf-py beside it): not shipped; set TBQ_LLAMA_CPP_CONVERTER to run these.
CONVERTER = os.environ.get("TBQ_LLAMA_CPP_CONVERTER")


@pytest.mark.skipif(CONVERTER is None, reason="TBQ_LLAMA_CPP_CONVERTER (llama.cpp's convert_hf_to_gguf.py) is not set")
@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "gpt_oss_default_rope", "qwen3_next"])
def test_tbq_eval_agrees_with_llama_perplexity_on_other_architectures(arch, tmp_path):
    """NEOX RoPE and QK-norm, soft-capping, sinks with sliding windows and head_dim 64, a hybrid: within 1e-3."""
    from tbq.hf.arch_compare import compare

    rows = unless_sigill(compare, [arch], LLAMA_CPP, CONVERTER, tmp_path, ("f16", "q4_0", "tbq4_0@fork"))
    for r in rows:
        assert r["rel"] is not None and abs(r["rel"]) <= 1e-3, r
