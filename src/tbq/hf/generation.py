"""What users check besides perplexity: greedy generation from their own prompts, with f16 and with a cache type.

:func:`generation_agreement` is ``tbq eval --prompts``' report (exact
matches, first differing token, JSON still well formed); :func:`read_prompts`
reads the prompts file. Split from :mod:`tbq.hf.evaluation`, whose runner it uses.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import TbqError, TbqValueError, check_int
from .evaluation import BASELINES, CacheType, _first_diff, _Runner, parse_cache_type, text_tokens

__all__ = ["generation_agreement", "read_prompts"]


def read_prompts(path: Any) -> list[str]:
    """Prompts from a file: one a line (blank lines skipped), or JSONL objects with a ``"prompt"`` string.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "p.jsonl"
    >>> _ = p.write_text('{"prompt": "a"}\\n{"prompt": "b"}\\n')
    >>> read_prompts(p)
    ['a', 'b']
    """
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TbqValueError(f"--prompts {path}: cannot read it as UTF-8 text: {exc}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise TbqValueError(f"--prompts {path}: no prompt in the file")
    objects = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            return lines  # plain text: one prompt a line
        objects.append(obj)
    if not all(isinstance(o, dict) for o in objects):
        return lines
    out = []
    for i, o in enumerate(objects, 1):
        if not isinstance(o.get("prompt"), str):
            raise TbqValueError(f'--prompts {path}: line {i} is a JSON object without a "prompt" string')
        out.append(o["prompt"])
    return out


def _json_value(text: str) -> bool:
    """True when ``text`` starts (after white space) with a complete JSON object or array."""
    t = text.lstrip()
    if not t.startswith(("{", "[")):
        return False
    try:
        json.JSONDecoder().raw_decode(t)
    except ValueError:
        return False
    return True


def generation_agreement(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    cache_types: Any,
    *,
    generate: int = 32,
    bos: int | None = None,
    sinks: int = 0,
    sink_type: Any = "f16",
    rotate_attention: bool = True,
    engine_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Greedy generation of ``generate`` tokens from each prompt with f16 and with each cache type.

    Per type: the share of prompts whose tokens equal f16's (``exact_match``),
    the first differing index of each prompt (``first_diff``, None when
    equal), and of the prompts whose f16 output starts with a complete JSON
    object or array (``json_f16``), how many the type's output still does
    (``json_kept``): a cache fine for chat can still break tool-call JSON.
    """
    check_int(generate, "generate", lo=1, expected="a positive integer", error=TbqValueError)
    types = [parse_cache_type(c) for c in cache_types]
    runner = _Runner(
        model,
        np.zeros((1, 2), np.int64),
        sinks=sinks,
        sink_type=sink_type,
        rotate_attention=rotate_attention,
        engine_options=engine_options,
    )
    if bos is None:
        bos = getattr(model.config, "bos_token_id", None)
    ids = [text_tokens(tokenizer, p, bos) for p in prompts]
    if any(len(i) == 0 for i in ids):
        raise TbqValueError("a prompt has no token (an empty prompt and no BOS)")
    f16 = CacheType("f16", "f16")
    base = [runner.greedy(f16, i, generate, baseline=True) for i in ids]
    base_json = [_json_value(tokenizer.decode(b)) for b in base]
    rows: list[dict[str, Any]] = []
    for ct in types:
        if ct.label in BASELINES:
            continue
        try:
            runner.cache(ct)
        except TbqError as exc:
            rows.append({"cache": ct.label, "refused": str(exc)})
            continue
        outs = [runner.greedy(ct, i, generate) for i in ids]
        diffs = [_first_diff(b, o) for b, o in zip(base, outs, strict=True)]
        kept = [_json_value(tokenizer.decode(o)) for o, j in zip(outs, base_json, strict=True) if j]
        rows.append(
            {
                "cache": ct.label,
                "exact_match": float(np.mean([d is None for d in diffs])),
                "first_diff": diffs,
                "json_f16": int(sum(base_json)),
                "json_kept": int(sum(kept)),
            }
        )
    return {"prompts": len(prompts), "generate": int(generate), "rows": rows}
