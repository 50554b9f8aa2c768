"""``tbq eval``: a model's predictions with its KV cache stored in tbq formats; the computation is :func:`tbq.hf.evaluate`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, TbqValueError
from ..formats import cache_formats, cache_types, formats
from ..hf import ENGINES
from . import check_figure_file, check_output_file, int_at_least

#: Chunks ``tbq eval`` scores unless told: enough for stable figures, few enough to finish in a minute or two.
DEFAULT_CHUNKS = 4


def _chunks_arg(text: str) -> Any:
    if text.strip().lower() == "all":
        return "all"
    return int_at_least(1, 1 << 20)(text)


_chunks_arg.__name__ = "a positive integer or 'all'"


def default_cache_types() -> list[str]:
    """Every format as K = V (formats llama.cpp has no cache type for, vLLM's FP8, stored plain), then the mixes users run."""
    from ..hf.engine import is_llama_cpp_type, is_turbo_type
    from ..hf.evaluation import BASELINES, DEFAULT_MIXES

    # the community fork's turbo types under its engine; formats no llama.cpp stores (vLLM's): plain rows
    same = [
        f"{f}:{f}" + ("@turbo" if is_turbo_type(f) else "" if is_llama_cpp_type(f) else "@plain")
        for f in cache_formats()
    ]
    return [t for t in same if t not in BASELINES] + list(DEFAULT_MIXES)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", nargs="?", help="a Hugging Face model directory or a .gguf file (default: the shipped model)"
    )
    d = p.add_argument_group("text")
    src = d.add_mutually_exclusive_group()
    src.add_argument(
        "--text",
        metavar="FILE",
        help="a UTF-8 text file, tokenized by the model's tokenizer "
        "with BOS first, as llama-perplexity does (default: the shipped held-out text)",
    )
    src.add_argument("--tokens", metavar="FILE.npy", help="a 1-d integer .npy array of token ids, used as it is")
    d.add_argument(
        "--context", type=int_at_least(4, 1 << 20), default=512, help="tokens per chunk (llama-perplexity's -c)"
    )
    d.add_argument(
        "--chunks",
        type=_chunks_arg,
        default=None,
        help="chunks to evaluate (llama-perplexity's --chunks), or 'all' "
        f"(default: {DEFAULT_CHUNKS}, or all the text holds if fewer)",
    )
    c = p.add_argument_group("cache")
    c.add_argument(
        "--cache-types",
        metavar="K:V,...",
        default=None,
        help="comma-separated cache types: K, K:V or K:V@ENGINE, each a cache type (a format name: f32, f16, q8_0, ...) or a vLLM preset "
        "(turboquant_4bit_nc, ...; engine vllm); ENGINE: llama.cpp, fork, turbo, vllm, vllm-prefill, plain; "
        "turbo2/3/4 alone select @turbo, a preset @vllm "
        "(default: every format as K = V plus q8_0:q4_0, q8_0:tbq4_0, tbq4_0:tbq3_0, f16:tbq3_0, ...)",
    )
    c.add_argument(
        "--engine",
        choices=ENGINES,
        default="llama.cpp",
        help="what stores the rows of the types written without @ENGINE: llama.cpp's -ctk/-ctv semantics, the same "
        "with the TurboQuant fork's defects (llama.cpp-fork), the community fork's turbo types (llama.cpp-turbo), "
        "vLLM's presets (vllm: every position reads the cache; vllm-prefill: a first prefill reads its raw K/V), "
        "or plain rows",
    )
    c.add_argument(
        "--no-turbo-auto-asymmetric",
        action="store_true",
        help="engine llama.cpp-turbo: no silent q8_0 K for equal turbo K/V at n_head/n_head_kv >= 6 "
        "(the fork's TURBO_AUTO_ASYMMETRIC=0)",
    )
    c.add_argument(
        "--no-turbo-layer-adaptive",
        action="store_true",
        help="engine llama.cpp-turbo: no silent q8_0 V in the first and last 2 layers for a turbo2 V "
        "(the fork's TURBO_LAYER_ADAPTIVE=0)",
    )
    c.add_argument(
        "--vllm-quantize-boundary",
        action="store_true",
        help="engines vllm, vllm-prefill: quantize the first and last 2 layers too (vLLM keeps them unquantized "
        "on dense models; this is not what vLLM runs)",
    )
    c.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a format option for the cache types that take it, repeatable, e.g. --option codebook=lloyd-max "
        "(TBQ; the llama.cpp engines default to the fork's tables) or --option scale=0.05 (FP8)",
    )
    c.add_argument(
        "--no-attn-rot", action="store_true", help="no attention rotation (llama.cpp's LLAMA_ATTN_ROT_DISABLE=1)"
    )
    c.add_argument(
        "--sinks", type=int_at_least(0, 1 << 20), default=0, help="the first N tokens of each chunk in --sink-type"
    )
    c.add_argument("--sink-type", default="f16", help="the format of the sink tokens")
    a = p.add_argument_group("analysis")
    a.add_argument("--per-layer", action="store_true", help="also one run per layer with only that layer in the type")
    a.add_argument("--roles", action="store_true", help="also K-only (K:f16) and V-only (f16:V) runs")
    a.add_argument(
        "--generate",
        type=int_at_least(0, 1 << 16),
        default=32,
        help="greedy tokens generated with each cache; the table shows the first that departs from f16's",
    )
    a.add_argument(
        "--prompts",
        metavar="FILE",
        help="also generate --generate greedy tokens (default 32) from each prompt of FILE (one a line, or JSONL "
        'with a "prompt" key) with f16 and each type: exact-match rate, first differing token, JSON still parsing',
    )
    a.add_argument(
        "--contexts",
        metavar="N,N,...",
        help="also a context sweep: the KL against f16 at each context length (e.g. 128,256,512), "
        "each as its own llama-perplexity chunking",
    )
    a.add_argument(
        "--capture",
        metavar="FILE.npz",
        help="also save the model's real post-RoPE K and V of the first chunk (arrays layer<L>_k, layer<L>_v)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the settings and rows as JSON on stdout")
    o.add_argument(
        "--kld",
        action="store_true",
        help="also print llama-perplexity --kl-divergence's statistics for each type, in its layout (base: f16)",
    )
    o.add_argument("--plot", metavar="FILE.png", help="also save a figure of the results (needs matplotlib)")
    o.add_argument("--quiet", action="store_true", help="no progress on stderr (it appears only on a terminal)")


def _cache_types(args: Any) -> list[Any]:
    from dataclasses import replace

    from ..formats import check_options, config_for, parse_option
    from ..hf.evaluation import parse_cache_type

    specs = default_cache_types() if args.cache_types is None else [s for s in args.cache_types.split(",")]
    if any(not s.strip() for s in specs):
        raise TbqValueError(f"--cache-types {args.cache_types!r}: an empty entry")
    types = [parse_cache_type(s, engine=args.engine) for s in specs]
    from ..vllm_slots import PRESET_NAMES

    known = cache_types() + PRESET_NAMES  # f32 is a registered cache type like the others
    for ct in types:  # a misspelt name is a usage error; a type this model refuses is a row with its reason
        for side in (ct.k, ct.v):
            if side not in known:
                raise TbqValueError(f"--cache-types: unknown cache type {side!r}; known: {', '.join(known)}")
    if not args.option:
        return types
    options = dict(parse_option(o) for o in args.option)
    names = sorted({t for ct in types for t in (ct.k, ct.v) if t in formats()})
    try:
        check_options(names, options)
    except TbqValueError as exc:
        raise TbqValueError(f"--option: {exc}") from None

    def with_options(t: Any) -> Any:
        own = config_for(t, options) if t in formats() else {}
        return (t, own) if own else t

    return [replace(ct, k=with_options(ct.k), v=with_options(ct.v)) for ct in types]


def _tokens(args: Any, tokenizer: Any, model: Any) -> np.ndarray:
    if args.tokens is not None:
        try:
            t = np.load(args.tokens, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise TbqValueError(f"--tokens {args.tokens}: cannot read it as a .npy file: {exc}") from None
        if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
            raise TbqValueError(
                f"--tokens {args.tokens}: expected a 1-d integer array, got {t.dtype} of shape {t.shape}"
            )
        vocab = model.config.get_text_config().vocab_size
        if t.size and (t.min() < 0 or t.max() >= vocab):
            raise TbqValueError(
                f"--tokens {args.tokens}: token ids must be in 0..{vocab - 1}, got {t.min()}..{t.max()}"
            )
        return t.astype(np.int64)
    if args.text is not None:
        try:
            text = Path(args.text).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise TbqValueError(f"--text {args.text}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    else:
        from ..hf.shipped import heldout_text

        text = heldout_text()
    from ..hf.evaluation import text_tokens

    return text_tokens(tokenizer, text, getattr(model.config, "bos_token_id", None))


def _contexts(text: str | None) -> list[int]:
    if text is None:
        return []
    out = []
    for part in text.split(","):
        try:
            c = int(part)
        except ValueError:
            raise TbqValueError(f"--contexts {text!r}: {part!r} is not an integer") from None
        if c < 4 or c % 2:
            raise TbqValueError(f"--contexts {text!r}: each context must be an even integer of at least 4, got {c}")
        out.append(c)
    return out


def _engine_options(args: Any) -> dict[str, Any]:
    """The TbqCache keywords of the engine flags that differ from the engines' own defaults."""
    out: dict[str, Any] = {}
    if args.no_turbo_auto_asymmetric:
        out["turbo_auto_asymmetric"] = False
    if args.no_turbo_layer_adaptive:
        out["turbo_layer_adaptive"] = False
    if args.vllm_quantize_boundary:
        out["vllm_skip_layers"] = False
    return out


def run_cli(args: argparse.Namespace) -> int:
    from ..progress import Progress

    # everything that can be checked before loading the model
    types = _cache_types(args)
    contexts = _contexts(args.contexts)
    if args.prompts is not None and not Path(args.prompts).is_file():
        raise TbqValueError(f"--prompts {args.prompts}: no such file")
    if args.prompts is not None and args.tokens is not None:
        raise TbqValueError("--prompts needs the model's tokenizer; it cannot go with --tokens")
    plot = check_figure_file(args.plot, "--plot") if args.plot else None
    capture = check_output_file(args.capture, "--capture") if args.capture else None
    if args.text is not None and not Path(args.text).is_file():
        raise TbqValueError(f"--text {args.text}: no such file")
    if args.tokens is not None and not Path(args.tokens).is_file():
        raise TbqValueError(f"--tokens {args.tokens}: no such file")
    try:
        from ..hf import evaluation as ev
        from ..hf import generation, stats
        from ..hf.loader import load, resolve_model_path
    except ImportError as exc:  # the hf extra is missing
        raise ConfigError(f"tbq eval needs the hf extra ({exc.name} is not installed): pip install '.[hf]'") from None
    path = resolve_model_path(args.model)
    if args.sink_type not in formats():
        raise TbqValueError(f"--sink-type {args.sink_type!r}: unknown format; known: {', '.join(formats())}")
    model, tokenizer = load(path, tokenizer=args.tokens is None)
    tokens = _tokens(args, tokenizer, model)
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    for c in contexts:  # refused before any work, naming the context
        if limit is not None and c > limit:
            raise TbqValueError(f"--contexts: {c} is beyond the model's limit of {limit} positions")
        if len(tokens) < 2 * c:
            raise TbqValueError(f"--contexts: {c} needs at least {2 * c} tokens of text, the text has {len(tokens)}")
    prompts = generation.read_prompts(args.prompts) if args.prompts is not None else None
    name = "shipped model" if args.model is None else str(args.model)
    bar = Progress(1, "tbq eval", enabled=False if args.quiet else None)

    def progress(done: Any, total: Any, label: Any) -> None:
        bar.total = total
        bar.done = done - 1
        bar.step(label)

    if args.chunks is None:
        chunks = min(DEFAULT_CHUNKS, len(tokens) // args.context) or None  # None: let evaluate refuse a short text
    else:
        chunks = None if args.chunks == "all" else args.chunks
    result = ev.evaluate(
        model,
        tokens,
        types,
        context=args.context,
        chunks=chunks,
        sinks=args.sinks,
        sink_type=args.sink_type,
        per_layer=args.per_layer,
        roles=args.roles,
        generate=args.generate,
        rotate_attention=not args.no_attn_rot,
        engine_options=_engine_options(args),
        model_name=Path(name).name if args.model else name,
        progress=progress,
    )
    extra: dict[str, Any] = {}
    if prompts is not None:
        extra["generation"] = generation.generation_agreement(
            model,
            tokenizer,
            prompts,
            types,
            generate=args.generate or 32,
            sinks=args.sinks,
            sink_type=args.sink_type,
            rotate_attention=not args.no_attn_rot,
            engine_options=_engine_options(args),
        )
    if contexts:
        extra["contexts"] = []
        for c in contexts:
            res = ev.evaluate(
                model,
                tokens,
                types,
                context=c,
                chunks=min(DEFAULT_CHUNKS, len(tokens) // c),
                sinks=args.sinks,
                sink_type=args.sink_type,
                rotate_attention=not args.no_attn_rot,
                engine_options=_engine_options(args),
            )
            extra["contexts"].append({"context": c, "chunks": res.settings["chunks"], "rows": res.to_dict()["rows"]})
    bar.close()
    if capture is not None:
        from ..hf.capture import capture_kv, save_kv

        kv = capture_kv(model, tokens[: args.context])
        written = save_kv(capture, kv)
        print(f"tbq eval: wrote the K and V of {len(kv)} layers ({args.context} tokens) to {written}", file=sys.stderr)
    if args.json:
        out = result.to_dict()
        out.update(extra)
        print(json.dumps(out, indent=2, allow_nan=False, default=ev.json_default))
    else:
        print(result.table())
        if args.generate:
            print(f"(greedy: the first of {args.generate} generated tokens that departs from f16's)")
        window = result.rows[1].window_bytes  # f16's
        windows = f", plus {window:,} B in the sliding-window layers' windows (f16)" if window else ""
        print(f"(B/token: one token's K and V rows in the full-attention layers{windows})")
        flags = [
            name
            for name, on in (
                ("no attention rotation", args.no_attn_rot),
                ("TURBO_AUTO_ASYMMETRIC=0", args.no_turbo_auto_asymmetric),
                ("TURBO_LAYER_ADAPTIVE=0", args.no_turbo_layer_adaptive),
                ("vLLM's boundary layers quantized too", args.vllm_quantize_boundary),
            )
            if on
        ]
        settings = "".join(f", {f}" for f in flags)
        print(f"(engine {args.engine} where no @ENGINE is written{settings}; {result.seconds:.1f} s)")
        for line in _extra_lines(extra):
            print(line)
        if args.kld:
            for r in result.rows[2:]:
                if r.refused is None:
                    print("\n".join(["", f"{r.cache} against the f16 cache:", *stats.kld_lines(r.llama_cpp)]))
    if plot is not None:
        from ..hf.plot import plot_eval

        written = plot_eval(result, plot)
        print(f"tbq eval: wrote {written}", file=sys.stderr)
    return 0


def _extra_lines(extra: dict[str, Any]) -> list[str]:
    """The generation and context-sweep tables under the main one."""
    lines: list[str] = []
    gen = extra.get("generation")
    if gen is not None:
        lines += [
            "",
            f"greedy generation from {gen['prompts']} prompts, {gen['generate']} tokens each, against f16:",
            f"{'cache K:V':<26} {'exact':>6} {'first diff (min, median)':>25} {'JSON kept':>10}",
        ]
        for r in gen["rows"]:
            if "refused" in r:
                lines.append(f"{r['cache']:<26} refused: {r['refused']}")
                continue
            diffs = sorted(d for d in r["first_diff"] if d is not None)
            where = "-" if not diffs else f"{diffs[0]}, {diffs[len(diffs) // 2]}"
            kept = "-" if not r["json_f16"] else f"{r['json_kept']}/{r['json_f16']}"
            lines.append(f"{r['cache']:<26} {r['exact_match']:>6.3f} {where:>25} {kept:>10}")
    for sweep in extra.get("contexts", []):
        if sweep is extra["contexts"][0]:
            lines += ["", "context sweep against f16: KL mean and PPL(Q)/PPL(base) by context:"]
            lines.append(f"{'context':>7} {'cache K:V':<26} {'KL mean':>9} {'PPL ratio':>10}")
        for r in sweep["rows"][2:]:
            if r["refused"] is not None:
                lines.append(f"{sweep['context']:>7} {r['cache']:<26} refused")
                continue
            ratio = r["llama_cpp"]["Mean PPL(Q)/PPL(base)"][0]
            lines.append(f"{sweep['context']:>7} {r['cache']:<26} {r['kl_mean']:>9.5f} {ratio:>10.5f}")
    return lines
