"""Train the project's own small Llama model on Python's standard library, deterministically.

    python -m tbq.hf.train --out DIR [--steps N] [--seed S] [size options]
    python -m tbq.hf.train --plot LOG.json PNG      # the loss curve of a training log

The corpus is the CPython standard library of the running interpreter
(``sysconfig.get_paths()["stdlib"]``): its top-level ``*.py`` files in sorted
order plus ``pydoc_data/topics.py`` (the documentation's text), each read as
UTF-8 bytes without newline translation. :data:`HELDOUT_FILES` are never
trained on (neither by the tokenizer nor by the model); their plain
concatenation is ``heldout.txt``. The log records the Python version and
:func:`corpus_sha256` of the file list and contents, so a run on another
interpreter is recognisable as a different corpus.

The steps, each seeded: a byte-level BPE tokenizer (``tokenizers``, GPT-2
regex, no prefix space, ``<|bos|>`` = 0 and ``<|eos|>`` = 1); the token stream
``<|bos|> file <|eos|>`` per training file; windows of ``seq_len`` tokens at
seeded random offsets whose first token is replaced by ``<|bos|>`` (what
llama.cpp's ``llama-perplexity`` does to each chunk it scores); a
``LlamaForCausalLM`` in float32 trained with AdamW, linear warm-up and a cosine
decay; the held-out loss at the end. DIR receives the Hugging Face checkpoint,
``tokenizer.json``, ``train_log.json``, ``heldout.txt`` and ``model.gguf``
(:func:`tbq.hf.gguf_export.export_gguf`).

torch, transformers and tokenizers are imported inside the functions that use
them, so importing this module is cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Never trained on. textwrap.py comes first: /work/shared/llama.cpp's README measured llama.cpp on it.
HELDOUT_FILES = ("textwrap.py", "shlex.py", "fnmatch.py")
#: Corpus files outside the top level of the standard library (English prose: the documentation's topics).
EXTRA_FILES = ("pydoc_data/topics.py",)
BOS, EOS = "<|bos|>", "<|eos|>"
#: general.name of the GGUF.
MODEL_NAME = "tbq-stdlib-llama"
#: The checkpoint files train() writes (besides model.gguf, train_log.json and heldout.txt).
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run; the defaults are the shipped model's."""

    steps: int = 400
    seed: int = 0
    threads: int = 1
    vocab_size: int = 1024
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 128
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    seq_len: int = 512
    batch_size: int = 8
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    log_every: int = 10
    max_files: int | None = None  # only the first N training files (tiny test runs)
    eval_chunks: list[int] = field(default_factory=lambda: [4])  # llama-perplexity style PPL over these chunk counts
    eval_max_chunks: int | None = None  # score only the first N held-out chunks (tiny test runs)


# ---------------------------------------------------------------------------------------------- corpus


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(stdlib: Path | None = None) -> list[str]:
    """The corpus, relative to the standard library: sorted top-level ``*.py`` files, then :data:`EXTRA_FILES`."""
    stdlib = stdlib_dir() if stdlib is None else stdlib
    names = sorted(p.name for p in stdlib.glob("*.py") if p.is_file())
    return names + [name for name in EXTRA_FILES if (stdlib / name).is_file()]


def read_file(stdlib: Path, name: str) -> str:
    """A corpus file as text: its UTF-8 bytes decoded, no newline translation."""
    return (stdlib / name).read_bytes().decode("utf-8")


def corpus_sha256(stdlib: Path, names: list[str]) -> str:
    """SHA-256 over every file in order: ``name``, NUL, the byte count in decimal, NUL, the bytes."""
    h = hashlib.sha256()
    for name in names:
        data = (stdlib / name).read_bytes()
        h.update(name.encode("utf-8") + b"\0" + str(len(data)).encode("ascii") + b"\0" + data)
    return h.hexdigest()


def load_corpus(stdlib: Path | None = None, max_files: int | None = None) -> dict[str, Any]:
    """Training texts, the held-out text and the corpus' identity."""
    stdlib = stdlib_dir() if stdlib is None else stdlib
    names = corpus_files(stdlib)
    missing = [name for name in HELDOUT_FILES if name not in names]
    if missing:
        raise FileNotFoundError(f"held-out files not in the standard library at {stdlib}: {missing}")
    train_names = [name for name in names if name not in HELDOUT_FILES]
    if max_files is not None:
        train_names = train_names[:max_files]
    train_texts = [read_file(stdlib, name) for name in train_names]
    heldout = "".join(read_file(stdlib, name) for name in HELDOUT_FILES)
    return {
        "stdlib": str(stdlib),
        "python": platform.python_version(),
        "files": len(names),
        "sha256": corpus_sha256(stdlib, names),
        "train_files": train_names,
        "train_bytes": sum(len(t.encode("utf-8")) for t in train_texts),
        "heldout_files": list(HELDOUT_FILES),
        "heldout_bytes": len(heldout.encode("utf-8")),
        "train_texts": train_texts,
        "heldout": heldout,
    }


# ---------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer``: GPT-2 regex, no prefix space, BOS/EOS ids 0 and 1.

    The post-processor prepends BOS (``add_special_tokens=True``), as llama.cpp
    does with ``tokenizer.ggml.add_bos_token``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.token_to_id(BOS) != 0 or tok.token_to_id(EOS) != 1:
        raise RuntimeError("BOS/EOS did not get ids 0/1")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, 0)]),
        ]
    )
    return tok


def save_tokenizer(tok: Any, out: Path, model_max_length: int) -> None:
    """tokenizer.json and tokenizer_config.json through transformers (what AutoTokenizer reads)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))


# ---------------------------------------------------------------------------------------------- model


def model_config(cfg: TrainConfig, vocab_size: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=True,
        initializer_range=cfg.initializer_range,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=0,
        eos_token_id=1,
        dtype="float32",
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine down to ``lr * min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


# ---------------------------------------------------------------------------------------------- training


def _setup_torch(cfg: TrainConfig) -> Any:
    import torch

    torch.set_num_threads(cfg.threads)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    return torch


def train(
    out: Path | str, cfg: TrainConfig = TrainConfig(), progress: Any = print, command: str | None = None
) -> dict[str, Any]:
    """Run the whole recipe into ``out``; returns the log (also written as ``out/train_log.json``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t_start = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch = _setup_torch(cfg)
    import tokenizers
    import transformers
    from transformers import LlamaForCausalLM

    from .gguf_export import chunk_nll, export_gguf, llama_perplexity

    corpus = load_corpus(max_files=cfg.max_files)
    (out / "heldout.txt").write_bytes(corpus["heldout"].encode("utf-8"))

    t0 = time.time()
    tok = train_tokenizer(corpus["train_texts"], cfg.vocab_size)
    save_tokenizer(tok, out, cfg.max_position_embeddings)
    t_tok = time.time() - t0
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    vocab = tok.get_vocab_size()

    stream = []
    for enc in tok.encode_batch(corpus["train_texts"], add_special_tokens=False):
        stream += [bos] + enc.ids + [eos]
    data = torch.tensor(stream, dtype=torch.long)
    heldout_ids = tok.encode(corpus["heldout"]).ids  # BOS first
    progress(
        f"corpus: {len(corpus['train_files'])} files, {corpus['train_bytes']} bytes -> {len(stream)} tokens; "
        f"held out {corpus['heldout_bytes']} bytes -> {len(heldout_ids)} tokens; tokenizer {t_tok:.1f} s"
    )

    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(model_config(cfg, vocab)).float()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    n_windows = len(stream) - cfg.seq_len
    if n_windows <= 0:
        raise ValueError(f"the corpus ({len(stream)} tokens) is shorter than one sequence of {cfg.seq_len}")

    log_rows, window = [], []
    model.train()
    t0 = time.time()
    for step in range(cfg.steps):
        starts = torch.randint(0, n_windows, (cfg.batch_size,), generator=gen)
        x = torch.stack([data[s : s + cfg.seq_len] for s in starts.tolist()])
        x[:, 0] = bos
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window.append(loss.item())
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            row = {
                "step": step + 1,
                "loss": window[-1],
                "loss_mean": sum(window) / len(window),
                "lr": lr,
                "grad_norm": float(gnorm),
                "seconds": round(time.time() - t0, 2),
            }
            log_rows.append(row)
            window = []
            progress(
                f"step {row['step']:5d}  loss {row['loss']:.4f}  mean {row['loss_mean']:.4f}  lr {lr:.2e}  {row['seconds']:.0f} s"
            )
    t_train = time.time() - t0

    model.eval()
    n_eval = len(heldout_ids) if cfg.eval_max_chunks is None else cfg.eval_max_chunks * cfg.seq_len
    nll = chunk_nll(model, heldout_ids[:n_eval], cfg.seq_len, bos)
    heldout = {
        "tokens": len(heldout_ids),
        "chunks": int(nll.shape[0]),
        "n_ctx": cfg.seq_len,
        "loss": float(nll.mean()),  # every position of every chunk
        "ppl": float(math.exp(nll.mean())),
        "llama_perplexity_style": {str(k): llama_perplexity(nll, k) for k in cfg.eval_chunks + [nll.shape[0]]},
    }
    progress(f"held-out loss {heldout['loss']:.4f} (PPL {heldout['ppl']:.3f}) over {heldout['chunks']} chunks")

    model.save_pretrained(str(out), safe_serialization=True)
    export_gguf(out, out / "model.gguf", name=MODEL_NAME)

    log = {
        "command": command,
        "config": asdict(cfg),
        "parameters": n_params,
        "vocab_size": vocab,
        "corpus": {k: v for k, v in corpus.items() if k not in ("train_texts", "heldout")},
        "train_tokens": len(stream),
        "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "seconds": {"tokenizer": round(t_tok, 2), "train": round(t_train, 2), "total": round(time.time() - t_start, 2)},
        "train_loss": log_rows,
        "heldout": heldout,
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


# ---------------------------------------------------------------------------------------------- figure


def plot_loss(log_path: Path | str, png_path: Path | str) -> Path:
    """The training-loss curve of a ``train_log.json`` (mean per logging interval) with the held-out loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = json.loads(Path(log_path).read_text())
    rows = log["train_loss"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2), dpi=100)
    ax.plot([r["step"] for r in rows], [r["loss_mean"] for r in rows], lw=1.2, label="train (mean per interval)")
    ax.axhline(log["heldout"]["loss"], color="C3", ls="--", lw=1, label=f"held-out {log['heldout']['loss']:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(0, min(8.0, max(r["loss_mean"] for r in rows) * 1.05))
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{log['parameters']:,} parameters, {log['tokens_seen']:,} tokens", fontsize=9)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, metadata={"Software": None})
    plt.close(fig)
    return png_path


# ---------------------------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbq.hf.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="output folder")
    p.add_argument("--plot", nargs=2, metavar=("LOG", "PNG"), help="only draw the loss curve of a train_log.json")
    d = TrainConfig()
    for f in (
        "steps",
        "seed",
        "threads",
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "max_position_embeddings",
        "seq_len",
        "batch_size",
        "warmup",
        "log_every",
        "max_files",
        "eval_max_chunks",
    ):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(d, f))
    for f in ("lr", "min_lr_ratio", "weight_decay", "grad_clip", "initializer_range"):
        p.add_argument("--" + f.replace("_", "-"), type=float, default=getattr(d, f))
    args = p.parse_args(argv)
    if args.plot:
        print(plot_loss(*args.plot))
        return 0
    if args.out is None:
        p.error("--out is required")
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k not in ("out", "plot")})
    log = train(
        args.out, cfg, command=" ".join(["python -m tbq.hf.train"] + list(sys.argv[1:] if argv is None else argv))
    )
    print(json.dumps({"parameters": log["parameters"], "seconds": log["seconds"], "heldout": log["heldout"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
