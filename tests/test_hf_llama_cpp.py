"""tbq eval against llama.cpp's own llama-perplexity (the TurboQuant fork's CPU build in ../shared/llama.cpp).

Same GGUF (the shipped model), same text, context and chunks: the perplexity
of tbq's llama.cpp engine with an f16, q8_0 and q4_0 cache must agree with
``llama-perplexity -ctk T -ctv T -fa on --no-warmup`` to 1e-3 relative. Skipped, with the
reason, where ../shared is absent (users' machines); CI has it.
"""

from __future__ import annotations

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
