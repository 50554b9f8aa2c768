"""``tbq eval``'s ``@turbo`` engine against the community TurboQuant fork's own llama-perplexity, on the shipped model.

    python -m tbq.hf.turbo_compare [--llama-dir ../shared/llama.cpp-turbo] [--markdown]

Both run the shipped GGUF on its held-out text with ``-c 512 --chunks 4 -t 2
-fa on`` (llama-perplexity) and ``context=512, chunks=4`` (:func:`tbq.hf.evaluate`);
each ``-ctk K -ctv V`` pair of :data:`PAIRS` is one row with both perplexities
and their relative difference. The fork's build is the one in
``../shared/llama.cpp-turbo`` (TheTom/llama-cpp-turboquant at 69d8e4be); its
logger sometimes loses the ``Final estimate`` line at exit, so each run is
retried until it appears (:func:`tbq.hf.gguf_export.run_llama_perplexity`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: The -ctk/-ctv pairs compared: the fork's turbo types, a mix, and llama.cpp's own types under the fork.
PAIRS = (
    ("f16", "f16"),
    ("q8_0", "q8_0"),
    ("q4_0", "q4_0"),
    ("turbo2", "turbo2"),
    ("turbo3", "turbo3"),
    ("turbo4", "turbo4"),
    ("q8_0", "turbo3"),
    ("q8_0", "turbo4"),
)

#: Where the fork's build lives next to the repository.
DEFAULT_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "llama.cpp-turbo"


def compare(
    llama_dir: Path | str = DEFAULT_DIR, pairs: Any = PAIRS, context: int = 512, chunks: int = 4
) -> list[dict[str, Any]]:
    """One dict per pair: ``k``, ``v``, ``theirs`` (llama-perplexity), ``ours`` (tbq eval), ``rel`` (ours/theirs - 1)."""
    from .evaluation import evaluate, text_tokens
    from .gguf_export import run_llama_perplexity
    from .loader import load
    from .shipped import MODEL_DIR, gguf_path

    model, tokenizer = load(gguf_path())
    text = MODEL_DIR / "heldout.txt"
    tokens = text_tokens(tokenizer, text.read_text(encoding="utf-8"), model.config.bos_token_id)
    res = evaluate(model, tokens, [f"{k}:{v}@turbo" for k, v in pairs], context=context, chunks=chunks, generate=0)
    rows = []
    for k, v in pairs:
        ours = res.row(f"{k}:{v}@turbo").ppl
        theirs = run_llama_perplexity(llama_dir, gguf_path(), text, context, chunks, cache_type=k, v_type=v)["ppl"]
        rows.append({"k": k, "v": v, "theirs": theirs, "ours": ours, "rel": ours / theirs - 1})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbq.hf.turbo_compare", description=__doc__.splitlines()[0])
    p.add_argument("--llama-dir", default=str(DEFAULT_DIR), help="the fork's build (bin/llama-perplexity)")
    p.add_argument("--markdown", action="store_true", help="a markdown table")
    args = p.parse_args(argv)
    if not (Path(args.llama_dir) / "bin" / "llama-perplexity").exists():
        print(f"turbo_compare: no bin/llama-perplexity in {args.llama_dir}", file=sys.stderr)
        return 2
    rows = compare(args.llama_dir)
    if args.markdown:
        print("| -ctk:-ctv | fork's llama-perplexity | tbq eval @turbo | relative difference |")
        print("|---|---|---|---|")
    for r in rows:
        if args.markdown:
            print(f"| {r['k']}:{r['v']} | {r['theirs']:.4f} | {r['ours']:.4f} | {r['rel']:+.1e} |")
        else:
            print(f"{r['k']}:{r['v']:<8} {r['theirs']:10.4f} {r['ours']:10.4f} {r['rel']:+.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
