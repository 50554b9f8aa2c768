"""tbq eval against llama.cpp's own llama-perplexity on the same GGUF, text, context and chunks.

For each cache type: ``llama-perplexity -m GGUF -f TEXT -c C --chunks N -t 2
-ctk K -ctv V -fa on --no-warmup`` (with ``LLAMA_ATTN_ROT_DISABLE=1`` for the rows
without attention rotation) next to :func:`tbq.hf.evaluate` with the same
tokens (the model's tokenizer, BOS first), and the relative difference.
The fork's TBQ rows are shown with the engine that reproduces its defects
(``@fork``) and with the correct one.

    python benchmarks/eval_vs_llama_cpp.py [--llama-cpp ../shared/llama.cpp] [--gguf FILE] [--text FILE]
                                           [--context 512] [--chunks 4] [--markdown]

Without ``--gguf`` it uses the shipped model's GGUF and held-out text.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT.parent / "shared" / "llama.cpp"

#: (K, V, rotation, tbq engine): what is compared
CASES = [
    ("f16", "f16", True, "llama.cpp"),
    ("q8_0", "q8_0", True, "llama.cpp"),
    ("q4_0", "q4_0", True, "llama.cpp"),
    ("q8_0", "q8_0", False, "llama.cpp"),
    ("q4_0", "q4_0", False, "llama.cpp"),
    ("q5_1", "q5_1", True, "llama.cpp"),
    ("iq4_nl", "iq4_nl", True, "llama.cpp"),
    ("q8_0", "q4_0", True, "llama.cpp"),
    ("q4_0", "q8_0", True, "llama.cpp"),
    ("tbq4_0", "tbq4_0", True, "llama.cpp-fork"),
    ("tbq4_0", "tbq4_0", True, "llama.cpp"),
    ("tbq3_0", "tbq3_0", True, "llama.cpp-fork"),
    ("tbq3_0", "tbq3_0", True, "llama.cpp"),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--llama-cpp", type=Path, default=DEFAULT_DIR, help="the llama.cpp folder (its bin/ holds llama-perplexity)"
    )
    p.add_argument("--gguf", type=Path)
    p.add_argument("--text", type=Path)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    from tbq.hf.evaluation import CacheType, evaluate, text_tokens
    from tbq.hf.gguf_export import run_llama_perplexity
    from tbq.hf.loader import load
    from tbq.hf.shipped import MODEL_DIR, gguf_path

    gguf = args.gguf or gguf_path()
    text = args.text or MODEL_DIR / "heldout.txt"
    binary = args.llama_cpp / "bin" / "llama-perplexity"
    if not binary.exists():
        raise SystemExit(f"no llama-perplexity at {binary}; pass --llama-cpp")
    model, tok = load(gguf)
    tokens = text_tokens(tok, text.read_text(encoding="utf-8"), model.config.bos_token_id)
    rows = []
    for rotate in (True, False):
        cases = [c for c in CASES if c[2] == rotate]
        res = evaluate(
            model,
            tokens,
            [CacheType(k, v, e) for k, v, _, e in cases if k != "f16"],
            context=args.context,
            chunks=args.chunks,
            rotate_attention=rotate,
        )
        for k, v, _, e in cases:
            ours = res.row(f"{k}:{v}" if k == "f16" else CacheType(k, v, e).label).ppl
            try:
                theirs = run_llama_perplexity(
                    args.llama_cpp, gguf, text, args.context, args.chunks, cache_type=k, v_type=v, rotate=rotate
                )["ppl"]
            except RuntimeError:  # e.g. an illegal instruction on this CPU: reported as no output
                theirs = None
            rows.append((f"{k}:{v}", "on" if rotate else "off", e, theirs, ours))
    print(f"{gguf.name}, {text.name}: -c {args.context} --chunks {args.chunks}, -fa on, 2 threads")
    if args.markdown:
        print("\n| -ctk:-ctv | attn rot | tbq engine | llama-perplexity | tbq eval | relative difference |")
        print("|---|---|---|---|---|---|")
    for cache, rot, e, theirs, ours in rows:
        rel = "n/a" if theirs is None else f"{ours / theirs - 1:+.1e}"
        t = "no output" if theirs is None else f"{theirs:.4f}"
        if args.markdown:
            print(f"| {cache} | {rot} | {e} | {t} | {ours:.4f} | {rel} |")
        else:
            print(f"{cache:<16} rot {rot:<3} {e:<15} llama-perplexity {t:>10}  tbq {ours:>10.4f}  {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
