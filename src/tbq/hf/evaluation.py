"""What a cache type does to a model's predictions: perplexity, KL, top-1 and greedy agreement.

The text is cut like llama.cpp's ``llama-perplexity``: chunks of
``context`` tokens, each starting with BOS (the chunk's first token
replaced), each run with a fresh cache as one batch, only the second half
of each chunk scored (logits at positions ``context/2 .. context-2``
predicting the next token), ``PPL = exp(mean NLL)``. So ``evaluate``'s
perplexity of a cache type is comparable with ``llama-perplexity -c
CONTEXT --chunks N -ctk K -ctv V -fa on`` on the same tokens.

Every cache type is held against two baselines computed on the same
chunks: the f16 cache (llama.cpp's default) and the f32 cache (the model's
own K/V). Per cache type: perplexity and its change against f16, mean and
99th-percentile KL divergence ``KL(base || type)`` of the next-token
distributions, top-1 agreement, and (``generate=N``) the index of the first
token where greedy generation from a prompt departs from the f16 cache's.
``per_layer=True`` adds one run per layer with only that layer in the type
(the rest f16), ``roles=True`` K-only and V-only runs.

>>> result = evaluate(model, tokens, ["q8_0", "q4_0:q4_0"], context=512, chunks=4)   # doctest: +SKIP
>>> print(result.table())                                                             # doctest: +SKIP

Why one module of this length: :func:`evaluate` and the runner that cuts, runs and scores the
chunks exactly as llama-perplexity does are one computation; the statistics are
:mod:`tbq.hf.stats`' and greedy agreement :mod:`tbq.hf.generation`'.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..errors import ConfigError, TbqError, TbqValueError, check_int
from .engine import ENGINES, F32, is_turbo_type, is_vllm_preset, unquantized_type
from .stats import Stats, kld_lines, kld_statistics

__all__ = [
    "CacheType",
    "EvalResult",
    "Row",
    "evaluate",
    "parse_cache_type",
    "perplexity_chunks",
    "text_tokens",
    "DEFAULT_MIXES",
    "kld_lines",
    "kld_statistics",
]

#: The two baselines every evaluation runs first.
BASELINES = ("f32:f32", "f16:f16")

#: The K:V mixes users run, added to every format as K=V by ``tbq eval``'s default list.
DEFAULT_MIXES = ("q8_0:q4_0", "q8_0:q5_0", "q8_0:tbq4_0", "q8_0:tbq3_0", "tbq4_0:tbq3_0", "f16:q4_0", "f16:tbq3_0")


#: Short engine names in cache-type labels and specs (``"tbq4_0@fork"``, ``"turbo3@turbo"``).
_SHORT = {"llama.cpp-fork": "fork", "llama.cpp-turbo": "turbo"}
_ALIASES = {v: k for k, v in _SHORT.items()}


@dataclass(frozen=True)
class CacheType:
    """A K:V pair of cache types and the engine that stores them."""

    k: object
    v: object
    engine: str = "llama.cpp"

    @property
    def options(self) -> dict[str, dict[str, Any]]:
        """The format options of each side that has any, ``{"K": {...}, "V": {...}}`` (empty: none).

        >>> CacheType(("tbq4_0", {"codebook": "lloyd-max"}), "q8_0").options
        {'K': {'codebook': 'lloyd-max'}}
        """
        out = {side: _side_options(t) for side, t in (("K", self.k), ("V", self.v))}
        return {side: o for side, o in out.items() if o}

    @property
    def label(self) -> str:
        """``K:V`` (``@engine`` unless llama.cpp), each side with options written ``name(opt=value,...)``.

        >>> CacheType(("tbq4_0", {"codebook": "lloyd-max"}), "q8_0", "plain").label
        'tbq4_0(codebook=lloyd-max):q8_0@plain'
        """

        def name(t: Any) -> str:
            base = t if isinstance(t, str) else getattr(t, "name", None) or str(t[0])
            opts = _side_options(t)
            return base if not opts else base + "(" + ",".join(f"{k}={_option_value(v)}" for k, v in opts.items()) + ")"

        text = f"{name(self.k)}:{name(self.v)}"
        if is_vllm_preset(self.k) and self.k == self.v:
            text = str(self.k)  # a preset names both K and V
        return text if self.engine == "llama.cpp" else f"{text}@{_SHORT.get(self.engine, self.engine)}"


#: Codec settings that are not format options (left out of a label).
_EXECUTION = ("name", "backend", "threads", "on_overflow")


def _side_options(t: Any) -> dict[str, Any]:
    """The format options one side of a cache type carries: a ``(name, options)`` pair's, a Codec's own."""
    if isinstance(t, tuple):
        return dict(t[1])
    if isinstance(t, str) or not hasattr(t, "get_config"):
        return {}
    return {k: v for k, v in t.get_config().items() if k not in _EXECUTION}


def _json_options(ct: CacheType) -> dict[str, dict[str, Any]]:
    """``ct.options`` with every value a JSON scalar (:func:`_option_value`)."""
    return {side: {k: _option_value(v) for k, v in o.items()} for side, o in ct.options.items()}


def _option_value(v: Any) -> str | int | float | bool | None:
    """An option value as the label and the JSON show it: a name or a number kept, else the object's own name."""
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(getattr(v, "name", None) or type(v).__name__)


def parse_cache_type(spec: Any, *, engine: str = "llama.cpp") -> CacheType:
    """``"q8_0"`` (K = V), ``"q8_0:q4_0"``, ``"tbq4_0:tbq4_0@llama.cpp-fork"`` (or ``@fork``), a ``(k, v)`` pair or a :class:`CacheType`.

    >>> parse_cache_type("q8_0:tbq4_0@plain")
    CacheType(k='q8_0', v='tbq4_0', engine='plain')
    """
    if isinstance(spec, CacheType):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return _own_engine(CacheType(spec[0], spec[1], engine), False)
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"a cache type is 'K', 'K:V' or 'K:V@ENGINE', got {spec!r}")
    text = spec.strip()
    explicit = "@" in text
    if explicit:
        text, engine = text.split("@", 1)
        engine = _ALIASES.get(engine, engine)
        if engine not in ENGINES:
            raise ConfigError(f"cache type {spec!r}: unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    parts = text.split(":")
    if len(parts) > 2 or not all(parts):
        raise ConfigError(f"cache type {spec!r}: expected 'K', 'K:V' or 'K:V@ENGINE'")
    return _own_engine(CacheType(parts[0], parts[-1], engine), explicit)


def _own_engine(ct: CacheType, explicit: bool) -> CacheType:
    """A type only one engine has selects it when no engine was written (and the default engine was asked for):
    the fork's turbo types the ``"llama.cpp-turbo"`` engine, vLLM's presets ``"vllm"`` (the label says so)."""
    if explicit or ct.engine != "llama.cpp":
        return ct
    if is_vllm_preset(ct.k) or is_vllm_preset(ct.v):
        return CacheType(ct.k, ct.v, "vllm")
    if is_turbo_type(ct.k) or is_turbo_type(ct.v):
        return CacheType(ct.k, ct.v, "llama.cpp-turbo")
    return ct


def text_tokens(tokenizer: Any, text: str, bos: int | None) -> np.ndarray:
    """The tokens llama-perplexity evaluates for ``text``: BOS (when the model has one), then the text's tokens.

    The tokenizer's own special tokens are not added (``bos`` is put first
    once, as llama.cpp's tokenizer does with ``add_bos``).
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return np.asarray(([] if bos is None else [int(bos)]) + list(ids), dtype=np.int64)


def perplexity_chunks(tokens: ArrayLike, context: int, chunks: int | None = None, bos: int | None = None) -> np.ndarray:
    """The ``(chunks, context)`` token array llama-perplexity evaluates; ``chunks=None``: as many as the text holds.

    Refused (one line) when the text holds fewer than two chunks (llama-perplexity
    needs ``2 * context`` tokens) or fewer than ``chunks``.

    >>> perplexity_chunks(np.arange(10), 4, bos=99)
    array([[99,  1,  2,  3],
           [99,  5,  6,  7]])
    """
    t = np.asarray(tokens)
    if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
        raise TbqValueError(f"tokens must be a 1-d integer array, got {t.dtype} of shape {t.shape}")
    context = check_int(context, "context", lo=4, expected="an even integer of at least 4", error=TbqValueError)
    if context % 2:
        raise TbqValueError(f"context must be an even integer of at least 4, got {context}")
    held = t.size // context
    if t.size < 2 * context:
        raise TbqValueError(
            f"the text has {t.size} tokens; llama-perplexity's chunking needs at least 2 x context = {2 * context}"
        )
    if chunks is None:
        chunks = held
    elif check_int(chunks, "chunks", lo=1, expected="a positive integer or None", error=TbqValueError) > held:
        raise TbqValueError(f"the text holds {held} chunks of {context} tokens ({t.size} tokens), not {chunks}")
    out = t[: chunks * context].reshape(chunks, context).astype(np.int64).copy()
    if bos is not None:
        out[:, 0] = bos
    return out


@dataclass
class Row:
    """One cache type's figures (baselines included), as the table and the JSON show them."""

    cache: str
    engine: str
    _: KW_ONLY
    bytes_per_token: int
    ppl: float
    delta_ppl_pct: float
    kl_mean: float
    kl_p99: float
    top1: float
    kl_f32_mean: float
    top1_f32: float
    #: the first greedy token that departs from the f16 cache's (None: none did, or no generation)
    first_diff: int | None = None
    layer: int | None = None
    role: str = "K+V"
    #: the format options of each side that has any (``CacheType.options``, values as the JSON shows them)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: bytes the sliding-window layers hold once their windows are full (not in ``bytes_per_token``)
    window_bytes: int = 0
    #: llama-perplexity ``--kl-divergence``'s statistics against the f16 cache, under its names (:func:`kld_statistics`)
    llama_cpp: dict[str, Any] = field(default_factory=dict)
    #: why this cache type was not run (its figures are then None)
    refused: str | None = None
    #: what the engine stored instead of the types asked for (the turbo fork's silent changes, vLLM's boundary layers)
    changes: list[str] = field(default_factory=list)


def _stats_row(stats: Stats, label: str, engine: str, ppl16: float | None, **extra: Any) -> Row:
    return Row(cache=label, engine=engine, **stats.fields(ppl16), **extra)


@dataclass
class EvalResult:
    """The result of :func:`evaluate`: one :class:`Row` per run, the settings, the wall time."""

    rows: list[Any]
    settings: dict[str, Any]
    seconds: float = 0.0
    per_layer: list[Any] = field(default_factory=list)

    def row(self, cache: str, *, layer: int | None = None, role: str = "K+V") -> Row:
        for r in self.rows + self.per_layer:
            if r.cache == cache and r.layer == layer and r.role == role:
                return r
        raise KeyError(cache)

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "seconds": self.seconds,
            "rows": [_row_dict(r) for r in self.rows],
            "per_layer": [_row_dict(r) for r in self.per_layer],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False, default=json_default)

    def table(self) -> str:
        """The rows as a text table (under 100 columns unless a label with options needs more; never cut)."""
        s = self.settings
        head = (
            f"{s['model']}: {s['chunks']} chunks x {s['context']} tokens, {s['scored']} scored; "
            f"KL, top-1 and greedy against the f16 cache"
        )
        width = max([26] + [len(_row_label(r)) for r in self.rows + self.per_layer])
        header = _header(width)
        lines = [head, header, "-" * len(header)]
        lines += [_format_row(r, width) for r in self.rows]
        if self.per_layer:
            lines += ["", "one layer (or one role) in the cache type, the rest f16:", header, "-" * len(header)]
            lines += [_format_row(r, width) for r in self.per_layer]
        return "\n".join(lines)


def json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(type(o).__name__)


def _header(width: int) -> str:
    return f"{'cache K:V':<{width}} {'layer':>5} {'B/token':>8} {'PPL':>9} {'dPPL %':>8} {'KL mean':>8} {'KL p99':>8} {'top-1':>6} {'greedy':>7}"


def _row_label(r: Row) -> str:
    return r.cache if r.role == "K+V" else f"{r.cache} ({r.role})"


#: The figures a refused row has none of (None in its JSON).
_FIGURES = ("ppl", "delta_ppl_pct", "kl_mean", "kl_p99", "top1", "kl_f32_mean", "top1_f32")


def _row_dict(r: Row) -> dict[str, Any]:
    d = asdict(r)
    if r.refused is not None:
        d.update(dict.fromkeys(_FIGURES))
    return d


def _format_row(r: Row, width: int = 26) -> str:
    label = _row_label(r)
    layer = "all" if r.layer is None else str(r.layer)
    if r.refused is not None:
        return f"{label:<{width}} {layer:>5} refused: {r.refused}"
    greedy = "same" if r.first_diff is None else str(r.first_diff)
    line = (
        f"{label:<{width}} {layer:>5} {r.bytes_per_token:>8} {r.ppl:>9.4f} {r.delta_ppl_pct:>+8.3f} "
        f"{r.kl_mean:>8.5f} {r.kl_p99:>8.5f} {r.top1:>6.3f} {greedy:>7}"
    )
    return "\n".join([line] + [f"  ^ {c}" for c in r.changes])


# ---------------------------------------------------------------------------
# the runs
# ---------------------------------------------------------------------------


def _log_softmax(logits: Any) -> Any:
    import torch

    return torch.log_softmax(logits.to(torch.float64), dim=-1)


class _Runner:
    """Forward passes of one model over fixed chunks with a fresh cache each."""

    def __init__(
        self,
        model: Any,
        chunks: np.ndarray,
        *,
        sinks: int,
        sink_type: Any,
        rotate_attention: bool,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        import torch

        from .attention import prepare, unread
        from .cache import TbqCache, cache_kwargs

        self.torch, self.TbqCache, self.cache_kwargs, self.unread = torch, TbqCache, cache_kwargs, unread
        self.model = prepare(model)
        self.chunks = torch.from_numpy(chunks)
        self.first = chunks.shape[1] // 2
        self.sinks, self.sink_type, self.rotate = sinks, sink_type, rotate_attention
        self.engine_options = dict(engine_options or {})
        self.model_type = getattr(model.config, "model_type", type(model).__name__)

    def cache(self, ct: CacheType, layers: dict[int, tuple[Any, Any]] | None = None, *, baseline: bool = False) -> Any:
        base_layers = None
        k, v = ct.k, ct.v
        if layers is not None:  # only these layers in the type: the rest unquantized (f16; vLLM: the model's own)
            base_layers, k, v = layers, unquantized_type(ct.engine), unquantized_type(ct.engine)
        return self.TbqCache(
            self.model.config,
            k,
            v,
            layers=base_layers,
            sinks=0 if baseline else self.sinks,
            sink_type=self.sink_type,
            engine=ct.engine,
            rotate_attention=self.rotate,
            model_domain=False,  # the tbq attention reads the stored domain; forward() checks every read was taken
            **self.engine_options,
        )

    def log_probs(
        self, i: int, ct: CacheType, layers: dict[int, tuple[Any, Any]] | None = None, *, baseline: bool = False
    ) -> Any:
        """log-softmax (float64) of the scored positions of chunk ``i`` and the cache's bytes per token."""
        cache = self.cache(ct, layers, baseline=baseline)
        logits = self.forward(self.chunks[i : i + 1], cache, ct)[0]
        return _log_softmax(logits[self.first : -1]), (
            cache.bytes_per_token(),
            cache.window_bytes(),
            cache.type_changes,
        )

    def forward(self, ids: Any, cache: Any, ct: CacheType) -> Any:
        """The model's logits over ``ids`` with ``cache``; a failure of the model's own code is one line naming it."""
        try:
            with self.torch.no_grad():
                logits = self.model(ids, use_cache=True, **self.cache_kwargs(self.model, cache)).logits
            left = self.unread()
            if left:
                raise TbqValueError(
                    f"{self.model_type}: the tbq attention did not read the stored K/V of layer(s) "
                    f"{', '.join(map(str, left))} with the {ct.label} cache (their attention modules have no "
                    "layer_idx or do not call the attention function): the engine's Q transform was not applied"
                )
            return logits
        except TbqError:
            raise
        except (ValueError, RuntimeError, NotImplementedError, TypeError, IndexError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TbqValueError(
                f"{self.model_type}: the forward pass with the {ct.label} cache failed: {type(exc).__name__}: {first}"
            ) from None

    def greedy(
        self,
        ct: CacheType,
        prompt: Any,
        n: int,
        layers: dict[int, tuple[Any, Any]] | None = None,
        *,
        baseline: bool = False,
    ) -> list[Any]:
        torch = self.torch
        cache = self.cache(ct, layers, baseline=baseline)
        ids = torch.as_tensor(np.asarray(prompt, np.int64))[None]
        out = []
        for _ in range(n):
            logits = self.forward(ids, cache, ct)[0, -1]
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            ids = torch.tensor([[nxt]])
        return out


#: The measured figures of a :class:`Row`: NaN in the row of a cache type that was not run.
_FIGURES = ("ppl", "delta_ppl_pct", "kl_mean", "kl_p99", "top1", "kl_f32_mean", "top1_f32")


def _refused_row(ct: CacheType, reason: str) -> Row:
    figures: dict[str, Any] = dict.fromkeys(_FIGURES, math.nan)
    return Row(ct.label, ct.engine, bytes_per_token=0, **figures, options=_json_options(ct), refused=reason)


def _first_diff(a: list[Any], b: list[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return i
    return None


def evaluate(
    model: Any,
    tokens: ArrayLike,
    cache_types: Any = ("q8_0", "q4_0"),
    *,
    context: int = 512,
    chunks: int | None = None,
    bos: int | None | bool = None,
    sinks: int = 0,
    sink_type: Any = "f16",
    per_layer: bool = False,
    roles: bool = False,
    generate: int = 0,
    prompt: Any = None,
    rotate_attention: bool = True,
    engine_options: dict[str, Any] | None = None,
    model_name: str = "model",
    progress: Any = None,
) -> EvalResult:
    """Evaluate ``cache_types`` on ``tokens`` against the f16 and f32 caches (see the module docstring).

    Parameters
    ----------
    model : a transformers causal LM (its attention is set to ``"tbq"`` in place, :func:`tbq.hf.prepare`).
    tokens : 1-d integer array of the text's tokens.
    cache_types : ``"K"``, ``"K:V"``, ``"K:V@ENGINE"``, ``(k, v)`` or :class:`CacheType` entries.
    context, chunks : llama-perplexity's ``-c`` and ``--chunks`` (``None``: every chunk the text holds).
    bos : the token that replaces each chunk's first; ``None`` takes ``model.config.bos_token_id``,
        ``False`` keeps the text's own first token.
    sinks, sink_type : the first ``sinks`` tokens of every chunk in ``sink_type`` (not in the baselines).
    per_layer : add one run per layer and cache type with only that layer in the type.
    roles : add K-only (``K:f16``) and V-only (``f16:V``) runs.
    generate : greedy tokens to generate from ``prompt`` (default: the first chunk's first
        ``context // 4`` tokens), reporting the first index that departs from the f16 cache's.
    engine_options : :class:`~tbq.hf.TbqCache` keywords of the engines that have them
        (``turbo_auto_asymmetric``, ``turbo_layer_adaptive``, ``vllm_skip_layers``).
    progress : ``callable(done, total, label)`` called after each run.
    """
    types = [parse_cache_type(c) for c in cache_types]
    if not types:
        raise ConfigError("no cache types to evaluate")
    if getattr(model, "training", False):
        raise ConfigError("the model is in training mode (dropout on): call model.eval() first")
    if bos is None:
        bos = getattr(model.config, "bos_token_id", None)
    elif bos is False:
        bos = None
    data = perplexity_chunks(tokens, context, chunks, bos)
    check_int(generate, "generate", lo=0, expected="a non-negative integer", error=TbqValueError)
    import torch

    t0 = time.perf_counter()
    runner = _Runner(
        model,
        data,
        sinks=sinks,
        sink_type=sink_type,
        rotate_attention=rotate_attention,
        engine_options=engine_options,
    )
    f16, f32 = CacheType("f16", "f16"), CacheType(F32, F32)
    attention_layers = [layer.index for layer in runner.cache(f16, baseline=True).tbq_layers]
    # the baselines are rows already; a type the model or llama.cpp refuses is a row with its reason, before any work
    refused: dict[str, str] = {}
    unique: dict[str, CacheType] = {}
    for ct in types:
        if ct.label in BASELINES or ct.label in unique or ct.label in refused:
            continue
        try:
            runner.cache(ct)
        except TbqError as exc:
            refused[ct.label] = str(exc)
            continue
        unique[ct.label] = ct
    if types and not unique and refused and all(ct.label not in BASELINES for ct in types):
        raise ConfigError(
            "every cache type was refused: " + "; ".join(f"{label}: {why}" for label, why in refused.items())
        )

    jobs: list[tuple[str, CacheType, int | None, str]] = [(ct.label, ct, None, "K+V") for ct in unique.values()]
    extra: list[tuple[str, CacheType, int | None, str]] = []
    for ct in unique.values():
        if roles:
            rest = unquantized_type(ct.engine)
            extra.append((ct.label, CacheType(ct.k, rest, ct.engine), None, "K"))
            extra.append((ct.label, CacheType(rest, ct.v, ct.engine), None, "V"))
        if per_layer:
            extra += [(ct.label, ct, layer, "K+V") for layer in attention_layers]
    total = (2 + len(jobs) + len(extra)) * data.shape[0] + (len(jobs) + 1 if generate else 0)
    done = 0

    def tick(label: Any) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    stats = {key: Stats() for key in ["f32", "f16"] + [j[:1] + j[2:] for j in jobs + extra]}
    first = data.shape[1] // 2
    for i in range(data.shape[0]):
        targets = torch.from_numpy(data[i, first + 1 :])
        b32, bpt32 = runner.log_probs(i, f32, baseline=True)
        tick(f"chunk {i + 1}: f32")
        b16, bpt16 = runner.log_probs(i, f16, baseline=True)
        tick(f"chunk {i + 1}: f16")
        stats["f32"].add(b32, targets, b16, b32, bpt32)
        stats["f16"].add(b16, targets, b16, b32, bpt16)
        for label, ct, layer, role in jobs + extra:
            layers = None if layer is None else {layer: (ct.k, ct.v)}
            lp, bpt = runner.log_probs(i, ct, layers)
            stats[(label, layer, role)].add(lp, targets, b16, b32, bpt)
            tick(
                f"chunk {i + 1}: {label}"
                + ("" if layer is None else f" layer {layer}")
                + ("" if role == "K+V" else f" {role}")
            )

    greedy = {}
    if generate:
        if prompt is None:
            prompt = data[0, : max(1, data.shape[1] // 4)]
        greedy["f16"] = runner.greedy(f16, prompt, generate, baseline=True)
        tick("greedy: f16")
        for label, ct, _, _ in jobs:
            greedy[label] = runner.greedy(ct, prompt, generate)
            tick(f"greedy: {label}")

    ppl16 = float(math.exp(np.concatenate(stats["f16"].nll).mean()))
    rows = [
        _stats_row(stats["f32"], BASELINES[0], "llama.cpp", ppl16),
        _stats_row(stats["f16"], BASELINES[1], "llama.cpp", ppl16),
    ]
    by_label = {
        label: _stats_row(
            stats[(label, None, "K+V")],
            label,
            ct.engine,
            ppl16,
            options=_json_options(ct),
            first_diff=_first_diff(greedy.get("f16", []), greedy.get(label, [])),
        )
        for label, ct, _, _ in jobs
    }
    for ct in types:  # the user's order, each label once; refused types with their reason
        if ct.label in refused:
            by_label.setdefault(ct.label, _refused_row(ct, refused[ct.label]))
    order = [r.cache for r in rows]
    for ct in types:
        if ct.label not in order:
            order.append(ct.label)
            rows.append(by_label[ct.label])
    layer_rows = [
        _stats_row(
            stats[(label, layer, role)], label, ct.engine, ppl16, layer=layer, role=role, options=_json_options(ct)
        )
        for label, ct, layer, role in extra
    ]
    settings = {
        "model": model_name,
        "context": int(data.shape[1]),
        "chunks": int(data.shape[0]),
        "scored": int(data.shape[0] * (data.shape[1] - 1 - first)),
        "bos": None if bos is None else int(bos),
        "sinks": int(sinks),
        "sink_type": sink_type if isinstance(sink_type, str) else getattr(sink_type, "name", str(sink_type)),
        "rotate_attention": bool(rotate_attention),
        "engine_options": dict(engine_options or {}),
        "generate": int(generate),
        "greedy_f16": greedy.get("f16"),
        "attention_layers": attention_layers,
    }
    return EvalResult(rows, settings, time.perf_counter() - t0, layer_rows)


def __getattr__(name: str) -> Any:
    """``read_prompts`` and ``generation_agreement`` live in :mod:`tbq.hf.generation`; these names still work."""
    if name in ("read_prompts", "generation_agreement"):
        from . import generation

        return getattr(generation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
