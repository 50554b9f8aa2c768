"""A Hugging Face Llama checkpoint as a llama.cpp GGUF, and the check of that GGUF against llama.cpp itself.

    python -m tbq.hf.gguf_export MODEL_DIR [OUT.gguf]            # write MODEL_DIR/model.gguf (or OUT)
    python -m tbq.hf.gguf_export MODEL_DIR --compare LLAMA_DIR   # llama.cpp vs transformers on heldout.txt

:func:`export_gguf` writes what llama.cpp's own converter (``convert_hf_to_gguf.py``,
``LlamaModel``) writes for a float32 Llama with a GPT-2 style byte-level BPE
tokenizer: the ``llama`` architecture's hyperparameter keys, the ``gpt2``
tokenizer (tokens, token types, merges, BOS/EOS, ``add_bos_token``) and the
tensors under gguf-py's ``llama`` tensor names, all F32. Like the converter it
permutes the rows of ``attn_q`` and ``attn_k`` (:func:`permute_qk`):
transformers rotates the two *halves* of each head (``rotate_half``), llama.cpp's
``LLAMA_ROPE_TYPE_NORM`` rotates *adjacent pairs*, and the permutation turns one
layout into the other. A tied checkpoint gets no ``output.weight`` (llama.cpp then
uses ``token_embd.weight``; transformers' GGUF loader sets ``tie_word_embeddings``).

``tokenizer.ggml.pre`` is ``"gpt-2"``: the converter finds the name by hashing
the tokens of a test string, which only identifies published tokenizers; a new
vocabulary has no hash, so the name is chosen by its regex. llama.cpp maps
``"gpt-2"`` to ``LLAMA_VOCAB_PRE_TYPE_GPT2``, the GPT-2 pattern the ``tokenizers``
ByteLevel pre-tokenizer uses (``use_regex=True``); :func:`compare_with_llama_cpp`
checks that llama.cpp's tokens equal transformers' on the held-out text.

:func:`compare_with_llama_cpp` runs ``llama-perplexity`` and ``dump_logits``
(/work/shared/llama.cpp) on a text and holds them against transformers' float32
forward pass: tokens, logits and the perplexity computed the llama-perplexity
way (:func:`chunk_nll`, :func:`llama_perplexity`), plain and with K/V rounded to
f16 the way llama.cpp's f16 cache stores them.

numpy, gguf and safetensors are imported by the functions that need them; torch
and transformers only by the comparison.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # numpy itself is imported by the functions that need it
    import numpy as np
    from numpy.typing import NDArray

#: llama.cpp's name for the GPT-2 pre-tokenizer regex (llama-vocab.cpp: LLAMA_VOCAB_PRE_TYPE_GPT2).
PRE_TOKENIZER = "gpt-2"
F16_KV_ATTENTION = "tbq_f16_kv_sdpa"


def permute_qk(w: Any, n_head: int) -> Any:
    """convert_hf_to_gguf.py's ``LlamaModel.permute``: per head, halves layout -> interleaved pairs.

    Row ``h*D + 2*i + j`` of the result is row ``h*D + j*D/2 + i`` of ``w``
    (``D`` = head_dim, ``i < D/2``, ``j`` in {0, 1}).
    """
    out = w.shape[0]
    return w.reshape(n_head, 2, out // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: Any, n_head: int) -> Any:
    """The inverse of :func:`permute_qk` (what transformers' GGUF loader applies)."""
    out = w.shape[0]
    return w.reshape(n_head, out // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(model_dir: Path) -> Any:
    """tokens, token types and the tokenizer (convert_hf_to_gguf.py's ``get_vocab_base``)."""
    import gguf
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    reverse = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(len(reverse)):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(reverse[i])
        if i in added:
            special = added[i].special or (reverse[i].startswith("<|") and reverse[i].endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def export_gguf(model_dir: Path | str, out_path: Path | str, name: str | None = None) -> Path:
    """Write ``model_dir``'s float32 Llama checkpoint and tokenizer as an F32 ``llama`` GGUF at ``out_path``."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    model_dir, out_path = Path(model_dir), Path(out_path)
    hp = json.loads((model_dir / "config.json").read_text())
    if hp.get("model_type") != "llama":
        raise ValueError(f"not a Llama checkpoint: model_type = {hp.get('model_type')!r}")
    tensors = load_file(str(model_dir / "model.safetensors"))
    n_layer, n_head, n_kv = hp["num_hidden_layers"], hp["num_attention_heads"], hp["num_key_value_heads"]
    head_dim = hp.get("head_dim") or hp["hidden_size"] // n_head
    rope = hp.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta", hp.get("rope_theta"))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only default RoPE is exported, not {rope.get('rope_type')!r}")

    w = gguf.GGUFWriter(str(out_path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    n_params = sum(int(t.size) for t in tensors.values())
    # general.* as the converter's Metadata.set_gguf_meta_model writes them for a local model
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name or model_dir.name)
    w.add_size_label(gguf.size_label(n_params, 0, 0, 0))
    # Model.set_gguf_parameters, then LlamaModel.set_gguf_parameters
    w.add_block_count(n_layer)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    if rope_theta is not None:
        w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(hp["vocab_size"])
    w.add_rope_dimension_count(head_dim)
    # _set_vocab_gpt2
    tokens, types = _vocab(model_dir)
    if len(tokens) != hp["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tokens)} tokens, config.vocab_size is {hp['vocab_size']}")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE_TOKENIZER)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=True)
    if special.add_special_token.get("bos") is not True or "bos" not in special.special_token_ids:
        raise ValueError(f"the tokenizer does not add BOS: {special}")
    special.add_to_gguf(w, quiet=True)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layer)
    order = ["model.embed_tokens.weight"]
    for i in range(n_layer):
        p = f"model.layers.{i}."
        order += [
            p + s + ".weight"
            for s in (
                "input_layernorm",
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "post_attention_layernorm",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
            )
        ]
    order += ["model.norm.weight"] + (["lm_head.weight"] if "lm_head.weight" in tensors else [])
    if sorted(order) != sorted(tensors):
        raise ValueError(f"unexpected tensors: {sorted(set(tensors) ^ set(order))}")
    for hf_name in order:
        data = np.ascontiguousarray(tensors[hf_name], dtype=np.float32)
        if hf_name.endswith("q_proj.weight"):
            data = permute_qk(data, n_head)
        elif hf_name.endswith("k_proj.weight"):
            data = permute_qk(data, n_kv)
        w.add_tensor(
            cast(str, names.get_name(hf_name, try_suffixes=(".weight",))),
            np.ascontiguousarray(data),
            raw_dtype=gguf.GGMLQuantizationType.F32,
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


# ---------------------------------------------------------------------------------------------- llama-perplexity in Python


def chunk_nll(
    model: Any, ids: Sequence[int] | NDArray[np.integer[Any]], n_ctx: int, bos_id: int = 0
) -> NDArray[np.float64]:
    """Per-position NLL (float64 array ``(chunks, n_ctx - 1)``) of ``ids`` cut into chunks the llama.cpp way.

    ``ids`` is the whole text tokenized with BOS in front; chunk ``c`` is
    ``ids[c*n_ctx:(c+1)*n_ctx]`` with its first token replaced by BOS; entry
    ``[c, j]`` is the NLL of token ``j + 1`` given tokens ``0..j``, from the
    float32 logits (log-softmax in float64).
    """
    import numpy as np
    import torch

    from .evaluation import perplexity_chunks

    chunks = perplexity_chunks(np.asarray(ids, dtype=np.int64), n_ctx, bos=bos_id)  # the one chunking rule
    out = np.empty((chunks.shape[0], n_ctx - 1), dtype=np.float64)
    with torch.no_grad():
        for c, row in enumerate(chunks):
            x = torch.from_numpy(row)
            logits = model(input_ids=x[None]).logits[0].double()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            out[c] = (-logp.gather(1, x[1:, None])[:, 0]).numpy()
    return out


def llama_perplexity(nll: NDArray[np.float64], n_chunks: int | None = None) -> float:
    """llama-perplexity's figure from :func:`chunk_nll`: the second half of each chunk, PPL = exp(mean NLL).

    perplexity.cpp scores the logits at positions ``n_ctx/2 .. n_ctx-2`` (the
    tokens ``n_ctx/2 + 1 .. n_ctx-1``) of each chunk.
    """
    import numpy as np

    nll = nll if n_chunks is None else nll[:n_chunks]
    first = (nll.shape[1] + 1) // 2
    return float(np.exp(nll[:, first:].mean()))


def register_f16_kv_attention() -> str:
    """An attention implementation that rounds K (after RoPE) and V to f16 and back, then runs SDPA.

    That is what llama.cpp's f16 KV cache does to K and V; with flash attention
    on the CPU the query and the arithmetic stay float32.
    """
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def f16_kv(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        return sdpa_attention_forward(
            module,
            query,
            key.to(torch.float16).to(query.dtype),
            value.to(torch.float16).to(query.dtype),
            attention_mask,
            **kwargs,
        )

    AttentionInterface.register(F16_KV_ATTENTION, f16_kv)
    return F16_KV_ATTENTION


# ---------------------------------------------------------------------------------------------- llama.cpp's tools


_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


class LlamaCppCrashed(RuntimeError):
    """A llama.cpp program died of a signal (SIGILL: a build for instructions this CPU lacks, such as AVX-512)."""

    def __init__(self, program: str, signal: int, cmd: list[str]) -> None:
        why = " (SIGILL: the build uses instructions this CPU lacks)" if signal == 4 else ""
        super().__init__(f"{program} died of signal {signal}{why}: {' '.join(cmd)}")
        self.program, self.signal = program, signal


def run_llama_perplexity(
    llama_dir: Path | str,
    gguf_path: Path | str,
    text_path: Path | str,
    n_ctx: int = 512,
    n_chunks: int = 4,
    threads: int = 2,
    cache_type: str = "f16",
    retries: int = 6,
    *,
    v_type: str | None = None,
    rotate: bool = True,
) -> dict[str, Any]:
    """``llama-perplexity -m GGUF -f TEXT -c n_ctx --chunks n -t threads -ctk K -ctv V -fa on --no-warmup``.

    ``cache_type`` is K's type, ``v_type`` V's (default: the same);
    ``rotate=False`` sets ``LLAMA_ATTN_ROT_DISABLE=1``. Retried when the
    asynchronous logger loses the ``Final estimate`` line at exit.
    ``--no-warmup``: the shared build was compiled with ``GGML_NATIVE`` on
    a CPU with AVX512-FP16; its warm-up (a 1-token batch) takes flash
    attention's one-row path, whose ``ggml_vec_dot_f16`` executes
    ``vfmadd231ph`` and dies with SIGILL on CPUs without AVX512-FP16 (AMD EPYC
    here). The 512-token chunks take the tiled path (f32 arithmetic) and run;
    the warm-up changes no result (its cache is cleared).
    """
    import os

    env = dict(os.environ)
    if not rotate:
        env["LLAMA_ATTN_ROT_DISABLE"] = "1"
    cmd = [
        str(Path(llama_dir) / "bin" / "llama-perplexity"),
        "-m",
        str(gguf_path),
        "-f",
        str(text_path),
        "-c",
        str(n_ctx),
        "--chunks",
        str(n_chunks),
        "-t",
        str(threads),
        "-ctk",
        cache_type,
        "-ctv",
        v_type or cache_type,
        "-fa",
        "on",
        "--no-warmup",
    ]
    for attempt in range(1, retries + 1):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode < 0:  # a crash is not the flaky run the retries are for
            raise LlamaCppCrashed("llama-perplexity", -proc.returncode, cmd)
        m = _FINAL.search(proc.stdout + proc.stderr)
        if m:
            return {
                "ppl": float(m.group(1)),
                "ppl_err": float(m.group(2)),
                "attempts": attempt,
                "command": " ".join(["llama-perplexity"] + cmd[1:]),
                "output": proc.stdout + proc.stderr,
            }
    raise RuntimeError(
        f"no 'Final estimate' line in {retries} runs of {' '.join(cmd)}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    )


def run_dump_logits(
    llama_dir: Path | str,
    gguf_path: Path | str,
    text_path: Path | str,
    out_bin: Path | str,
    n_ctx: int = 512,
    n_chunks: int = 4,
    *,
    cache_type: str = "f16",
    fa: int = 1,
    threads: int = 2,
) -> Any:
    """llama.cpp's tokens ``(chunks, n_ctx)`` and float32 logits ``(chunks, n_ctx, vocab)`` from ``dump_logits``."""
    import numpy as np

    cmd = [
        str(Path(llama_dir) / "bin" / "dump_logits"),
        str(gguf_path),
        str(text_path),
        str(out_bin),
        str(n_ctx),
        str(n_chunks),
        cache_type,
        cache_type,
        str(fa),
        str(threads),
    ]
    proc = subprocess.run(cmd, capture_output=True)
    if proc.returncode < 0:
        raise LlamaCppCrashed("dump_logits", -proc.returncode, cmd)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
    raw = Path(out_bin).read_bytes()
    n_ctx_, n_vocab, n_chunks_ = np.frombuffer(raw, dtype=np.int32, count=3)
    tokens = np.frombuffer(raw, dtype=np.int32, count=n_chunks_ * n_ctx_, offset=12).reshape(n_chunks_, n_ctx_)
    logits = np.frombuffer(raw, dtype=np.float32, offset=12 + 4 * n_chunks_ * n_ctx_).reshape(
        n_chunks_, n_ctx_, n_vocab
    )
    return tokens, logits


def compare_with_llama_cpp(
    model_dir: Path | str,
    llama_dir: Path | str,
    text_path: Path | str | None = None,
    n_ctx: int = 512,
    n_chunks: int = 4,
    threads: int = 2,
    work_dir: Path | str | None = None,
) -> dict[str, Any]:
    """llama.cpp (f16 cache, flash attention) against transformers (float32) on ``text_path`` (default heldout.txt).

    Returns the llama-perplexity figure, the perplexity of dump_logits' logits,
    whether llama.cpp's tokens equal the transformers tokenizer's (BOS first in
    every chunk), the max abs and relative logit differences, and the Python
    perplexities with float32 K/V and with K/V rounded to f16.
    """
    import tempfile

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    text_path = Path(text_path) if text_path is not None else model_dir / "heldout.txt"
    gguf_path = model_dir / "model.gguf"
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tok(text_path.read_bytes().decode("utf-8"))["input_ids"]
    bos = tok.bos_token_id
    n_chunks = min(n_chunks, len(ids) // n_ctx)

    ppl_cpp = run_llama_perplexity(llama_dir, gguf_path, text_path, n_ctx, n_chunks, threads)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        cpp_tokens, cpp_logits = run_dump_logits(
            llama_dir, gguf_path, text_path, Path(tmp) / "logits.bin", n_ctx, n_chunks, threads=threads
        )
        cpp_logits = np.array(cpp_logits)
    expected = np.array(ids[: n_chunks * n_ctx], dtype=np.int32).reshape(n_chunks, n_ctx)
    expected[:, 0] = bos
    tokens_equal = bool(np.array_equal(cpp_tokens, expected))

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = np.stack(
            [
                model(input_ids=torch.tensor(expected[c], dtype=torch.long)[None]).logits[0].numpy()
                for c in range(n_chunks)
            ]
        )
    diff = np.abs(hf_logits.astype(np.float64) - cpp_logits)
    nll32 = chunk_nll(model, ids[: n_chunks * n_ctx], n_ctx, bos)
    model.set_attn_implementation(register_f16_kv_attention())
    nll16 = chunk_nll(model, ids[: n_chunks * n_ctx], n_ctx, bos)
    with torch.no_grad():
        hf16_logits = np.stack(
            [
                model(input_ids=torch.tensor(expected[c], dtype=torch.long)[None]).logits[0].numpy()
                for c in range(n_chunks)
            ]
        )
    diff16 = np.abs(hf16_logits.astype(np.float64) - cpp_logits)

    lp = torch.log_softmax(torch.from_numpy(cpp_logits[:, :-1]).double(), dim=-1)
    nll_cpp = (-lp.gather(2, torch.from_numpy(expected[:, 1:]).long()[..., None])[..., 0]).numpy()
    ppl_py32, ppl_py16, ppl_dump = llama_perplexity(nll32), llama_perplexity(nll16), llama_perplexity(nll_cpp)
    return {
        "text": text_path.name,
        "n_ctx": n_ctx,
        "n_chunks": n_chunks,
        "llama_perplexity": ppl_cpp["ppl"],
        "llama_perplexity_command": ppl_cpp["command"],
        "dump_logits_ppl": ppl_dump,
        "tokens_equal": tokens_equal,
        "token_mismatches": int((cpp_tokens != expected).sum()),
        "logits_max_abs_diff": float(diff.max()),
        "logits_max_rel_diff": float(diff.max() / np.abs(hf_logits).max()),
        "logits_mean_abs_diff": float(diff.mean()),
        "logits_max_abs_diff_f16_kv": float(diff16.max()),
        "logits_mean_abs_diff_f16_kv": float(diff16.mean()),
        "python_ppl_f32": ppl_py32,
        "python_ppl_f16_kv": ppl_py16,
        # against llama-perplexity's printed figure (4 decimals) and against dump_logits' full-precision logits
        "rel_diff_f32": abs(ppl_py32 - ppl_cpp["ppl"]) / ppl_cpp["ppl"],
        "rel_diff_f16_kv": abs(ppl_py16 - ppl_cpp["ppl"]) / ppl_cpp["ppl"],
        "rel_diff_f32_vs_dump": abs(ppl_py32 - ppl_dump) / ppl_dump,
        "rel_diff_f16_kv_vs_dump": abs(ppl_py16 - ppl_dump) / ppl_dump,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbq.hf.gguf_export", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("out", type=Path, nargs="?", help="default: MODEL_DIR/model.gguf")
    p.add_argument("--compare", type=Path, metavar="LLAMA_DIR", help="compare against llama.cpp instead of exporting")
    p.add_argument("--text", type=Path, help="text for --compare (default MODEL_DIR/heldout.txt)")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--ctx", type=int, default=512)
    args = p.parse_args(argv)
    if args.compare:
        print(
            json.dumps(compare_with_llama_cpp(args.model_dir, args.compare, args.text, args.ctx, args.chunks), indent=1)
        )
    else:
        print(export_gguf(args.model_dir, args.out or args.model_dir / "model.gguf"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
