"""``tbq eval`` against llama-perplexity on tiny random checkpoints of the architectures people run.

    python -m tbq.hf.arch_compare --converter LLAMA_CPP/convert_hf_to_gguf.py [--llama-dir DIR] [--markdown]

For each architecture (:data:`ARCHITECTURES`) it builds a tiny random-weight
checkpoint with transformers' ``from_config`` and the shipped tokenizer
(:func:`tiny_checkpoint`), converts it to an F32 GGUF with **llama.cpp's own
converter** (a path you give: llama.cpp's ``convert_hf_to_gguf.py`` and the
``gguf-py`` next to it; nothing of llama.cpp is shipped with tbq), then runs
``llama-perplexity -c 512 --chunks 4 -fa on --no-warmup -ctk T -ctv T`` on the
GGUF and :func:`tbq.hf.evaluate` on the checkpoint over the shipped held-out
text, and prints both perplexities and their relative difference.

Two things are set for the converter, both about the vocabulary, not the
model: the shipped tokenizer is a new byte-level BPE, whose pre-tokenizer the
converter cannot identify by hash, so it is declared ``gpt-2`` (the regex it
uses, as :mod:`tbq.hf.gguf_export` does for the shipped model); and the
architectures whose converter insists on a SentencePiece model (gemma2, phi3)
take the same GPT-2 vocabulary instead.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .engine import F32
from .gguf_export import LlamaCppCrashed, run_llama_perplexity

__all__ = ["ARCHITECTURES", "tiny_model", "tiny_checkpoint", "convert_with_llama_cpp", "compare", "main"]

#: The architectures compared, and what each exercises.
ARCHITECTURES = {
    "llama": "normal RoPE (llama.cpp's converter permutes Q/K), head_dim 128",
    "llama_head_dim_80": "head_dim 80 (only f16/f32 and row-tiled types fit)",
    "llama_head_dim_96": "head_dim 96 (32-value blocks fit; no attention rotation: not a multiple of 64)",
    "qwen3": "NEOX RoPE, QK-norm",
    "gemma2": "attention and final soft-capping, alternating sliding window",
    "gemma3": "5 sliding-window layers per full one, QK-norm",
    "gemma3_head_dim_256": "the same at gemma3's own head_dim 256 (rotation by H_256)",
    "gpt_oss": "learned attention sinks, sliding window, YaRN, MoE, head_dim 64",
    "gpt_oss_default_rope": "the same with plain RoPE instead of YaRN",
    "phi3": "fused QKV",
    "qwen3_next": "hybrid: 3 linear-attention (gated delta-net) layers per full-attention layer",
    "qwen3_5": "the Qwen3.5 family's hybrid text model, the same layout",
}

#: The bootstrap that runs llama.cpp's converter with the two vocabulary settings above.
_BOOTSTRAP = """
import importlib.util, sys
converter, gguf_py = sys.argv[1], sys.argv[2]
sys.path.insert(0, gguf_py)
spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", converter)
conv = importlib.util.module_from_spec(spec)
sys.modules["convert_hf_to_gguf"] = conv
spec.loader.exec_module(conv)
def no_sentencepiece(self, *args, **kwargs):
    raise FileNotFoundError("no SentencePiece model: the GPT-2 byte-level vocabulary")
conv.TextModel._set_vocab_sentencepiece = no_sentencepiece
conv.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for name in ("Gemma2Model", "Phi3MiniModel"):
    if hasattr(conv, name):
        getattr(conv, name).set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
conv.main()
"""


def tiny_model(
    arch: str,
    *,
    hidden_size: int = 128,
    head_dim: int = 128,
    layers: int | None = None,
    window: int = 64,
    vocab_size: int = 1024,
    bos: int = 0,
    eos: int = 1,
    softcap: float = 5.0,
    seed: int = 0,
) -> Any:
    """A tiny random-weight ``arch`` model (eval mode), built with ``from_config``: nothing is downloaded.

    4 attention heads over 2 KV heads of ``head_dim`` (phi3, which has no
    head_dim setting: ``hidden_size = 4 x 64``; gpt-oss: at most 64); 2 layers,
    except gemma3 (``layers``, default 6: llama.cpp's pattern of 5 sliding
    layers, then a full one; the last is full) and the hybrids (4: 3
    linear-attention layers, then a full-attention one, llama.cpp's layout).
    Q and K projections are scaled by 4 (so quantization shows in the
    logits) and gpt-oss's sinks drawn from N(0, 2) (so they matter).
    """
    import torch
    import transformers as tf

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    torch.manual_seed(seed)
    common: dict[str, Any] = dict(
        hidden_size=hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=arch
        in ("gemma2", "gemma3"),  # gemma's output is its embedding (the converter drops lm_head)
    )
    sliding: dict[str, Any] = dict(sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    hybrid: dict[str, Any] = dict(
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    )
    model: Any
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(head_dim=head_dim, **common))
    elif arch in ("llama_head_dim_80", "llama_head_dim_96"):
        model = tf.LlamaForCausalLM(tf.LlamaConfig(head_dim=int(arch.rsplit("_", 1)[1]), **common))
    elif arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=head_dim, **common))
    elif arch == "gemma2":
        model = tf.Gemma2ForCausalLM(
            tf.Gemma2Config(
                head_dim=head_dim,
                query_pre_attn_scalar=head_dim,
                attn_logit_softcapping=softcap,
                final_logit_softcapping=30.0,
                sliding_window=window,
                **common,
            )
        )
    elif arch in ("gemma3", "gemma3_head_dim_256"):
        head_dim = 256 if arch == "gemma3_head_dim_256" else head_dim
        n = 6 if layers is None else layers
        common["num_hidden_layers"] = n
        kinds = ["sliding_attention"] * (n - 1) + ["full_attention"]
        model = tf.Gemma3ForCausalLM(
            tf.Gemma3TextConfig(
                head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=window, layer_types=kinds, **common
            )
        )
    elif arch in ("gpt_oss", "gpt_oss_default_rope"):
        if arch == "gpt_oss_default_rope":
            common["rope_parameters"] = {"rope_type": "default", "rope_theta": 150000.0}
        hd = min(head_dim, 64)
        model = tf.GptOssForCausalLM(
            tf.GptOssConfig(head_dim=hd, num_local_experts=4, num_experts_per_tok=2, **sliding, **common)
        )
    elif arch == "phi3":
        model = tf.Phi3ForCausalLM(tf.Phi3Config(**dict(common, hidden_size=4 * 64), pad_token_id=eos))
    elif arch == "qwen3_next":
        common["num_hidden_layers"] = 4
        cfg = tf.Qwen3NextConfig(
            head_dim=head_dim,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            **hybrid,
            **common,
        )
        model = tf.Qwen3NextForCausalLM(cfg)
    else:  # qwen3_5
        common["num_hidden_layers"] = 4
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(head_dim=head_dim, **hybrid, **common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                p.mul_(4)
            if name.endswith("sinks"):
                p.normal_(0.0, 2.0)
    return model.eval()


def tiny_checkpoint(arch: str, out: Path | str, **kwargs: Any) -> Path:
    """:func:`tiny_model` saved at ``out`` with the shipped tokenizer (its vocabulary is 1024: keep that)."""
    from .shipped import MODEL_DIR

    out = Path(out)
    tiny_model(arch, **kwargs).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODEL_DIR / f, out / f)
    return out


def convert_with_llama_cpp(model_dir: Path | str, out: Path | str, converter: Path | str) -> Path:
    """``model_dir`` as an F32 GGUF written by llama.cpp's ``convert_hf_to_gguf.py`` (its ``gguf-py`` beside it)."""
    converter = Path(converter)
    gguf_py = converter.parent / "gguf-py"
    cmd = [sys.executable, "-c", _BOOTSTRAP, str(converter), str(gguf_py), str(model_dir)]
    cmd += ["--outtype", "f32", "--outfile", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"llama.cpp's converter failed on {model_dir}: {last}")
    return Path(out)


def compare(
    archs: list[str],
    llama_dir: Path | str,
    converter: Path | str,
    work: Path | str,
    types: tuple[str, ...] = ("f16", "q8_0", "q4_0"),
    context: int = 512,
    chunks: int = 4,
) -> list[dict[str, Any]]:
    """One row per architecture and cache type: llama-perplexity's and tbq eval's perplexity (None: not run, why)."""
    from .evaluation import evaluate, parse_cache_type, text_tokens
    from .loader import load
    from .shipped import MODEL_DIR

    text = MODEL_DIR / "heldout.txt"
    rows = []
    for arch in archs:
        d = tiny_checkpoint(arch, Path(work) / arch)
        gguf = Path(work) / f"{arch}.gguf"
        why = None
        try:
            convert_with_llama_cpp(d, gguf, converter)
        except RuntimeError as exc:
            why = str(exc)
        model, tok = load(d)
        tokens = text_tokens(tok, text.read_text(encoding="utf-8"), model.config.bos_token_id)
        asked = [*types, F32]  # the baselines are rows already; with f32 asked a model refusing every type still runs
        res = evaluate(model, tokens, asked, context=context, chunks=chunks)
        for t in types:
            name = t.partition("@")[0]  # "tbq4_0@fork": the fork's defects, what llama-perplexity runs
            ours = res.row(parse_cache_type(t).label)
            theirs, note = None, why
            if ours.refused:
                note = ours.refused
            elif why is None:
                try:
                    theirs = run_llama_perplexity(llama_dir, gguf, text, context, chunks, cache_type=name)["ppl"]
                except (RuntimeError, LlamaCppCrashed) as exc:
                    note = _llama_cpp_error(str(exc), gguf, llama_dir, text)
            tbq = None if ours.refused else ours.ppl
            rel = None if theirs is None or tbq is None else tbq / theirs - 1.0
            rows.append(dict(arch=arch, cache=t, llama_cpp=theirs, tbq=tbq, rel=rel, note=note))
    return rows


def _llama_cpp_error(message: str, gguf: Path, llama_dir: Path | str, text: Path) -> str:
    """The line llama-perplexity's log gives for a model it cannot load, else the first line of ``message``.

    Its logger is asynchronous and loses lines at exit now and then: up to 3 runs.
    """
    log = Path(str(gguf) + ".log")
    for _ in range(3):
        if not log.is_file() or "error loading model" not in log.read_text(errors="replace"):
            cmd = [str(Path(llama_dir) / "bin" / "llama-perplexity"), "-m", str(gguf), "-f", str(text)]
            subprocess.run([*cmd, "--log-file", str(log)], capture_output=True, text=True)
        if log.is_file():
            for line in log.read_text(errors="replace").splitlines():
                if "error loading model" in line:
                    return "llama-perplexity: " + line.split("error loading model:", 1)[-1].strip()
    return message.splitlines()[0]


def _markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| architecture | -ctk = -ctv | llama-perplexity | tbq eval | relative difference |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        theirs = "-" if r["llama_cpp"] is None else f"{r['llama_cpp']:.4f}"
        ours = "-" if r["tbq"] is None else f"{r['tbq']:.4f}"
        rel = (r["note"] or "not run") if r["rel"] is None else f"{r['rel']:+.1e}"
        out.append(f"| {r['arch']} | {r['cache']} | {theirs} | {ours} | {rel} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbq.hf.arch_compare", description=__doc__.splitlines()[0])
    p.add_argument("--converter", required=True, help="llama.cpp's convert_hf_to_gguf.py (gguf-py beside it)")
    p.add_argument("--llama-dir", default=str(Path(__file__).resolve().parents[4] / "shared" / "llama.cpp"))
    p.add_argument("--arch", action="append", choices=list(ARCHITECTURES), help="default: all")
    p.add_argument(
        "--types",
        default="f16,q8_0,q4_0",
        help="K = V cache types, comma-separated; NAME@fork for the fork's TBQ defects (what its llama-perplexity runs)",
    )
    p.add_argument("--work", default=None, help="where the checkpoints and GGUFs go (default: a temporary folder)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        types = tuple(t.strip() for t in args.types.split(","))
        rows = compare(args.arch or list(ARCHITECTURES), args.llama_dir, args.converter, args.work or tmp, types)
    if args.markdown:
        print(_markdown(rows))
    else:
        for r in rows:
            rel = "" if r["rel"] is None else f"{r['rel']:+.1e}"
            print(r["arch"], r["cache"], r["llama_cpp"], r["tbq"], rel, r["note"] or "")
    worst = max((abs(r["rel"]) for r in rows if r["rel"] is not None), default=math.nan)
    print(f"worst relative difference: {worst:.1e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
