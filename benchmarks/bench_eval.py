"""tbq eval's cache overhead: a forward pass with a TbqCache against the same pass with transformers' own cache.

Two models, both on the CPU in float32, one prefill of ``--context`` tokens
(as ``tbq eval`` runs each chunk):

- the shipped model (``tbq.hf.shipped``), loaded from its checkpoint;
- a random-weight Llama of realistic size built here (no download):
  hidden 1024, 32 layers, 8 query heads and 2 KV heads of 128, MLP 2816,
  vocab 32000: about 0.43 B parameters.

For each cache type the overhead is ``(t_cache - t_own) / t_own`` with both
times the best of ``--rounds`` interleaved rounds (the same round order for
every type; the same for the process's CPU time, less sensitive to other
processes' load), plus the cache's measured size against bytes per token x tokens.
The cache is built as ``tbq eval`` builds it (the tbq attention reading the
stored domain, ``model_domain=False``). Targets: at most 25 % on the shipped
model at context 512, at most 3 % on the large one. The JSON also records the
CPU, the torch threads and the load average before and after (``os.getloadavg``):
on a machine shared with other work the wall times and overheads are noisy.

    python benchmarks/bench_eval.py [--context 512] [--rounds 5] [--threads 2] [--formats q8_0,q4_0,...]
        [--large-formats ...] [--no-large] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from tbq.hf import TbqCache, prepare
from tbq.hf.loader import load

DEFAULT_FORMATS = "f16,q8_0,q4_0,q5_1,iq4_nl,tbq4_0,tbq3_0,planar3_0,nvfp4"


def large_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=1024,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        num_hidden_layers=32,
        intermediate_size=2816,
        vocab_size=32000,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


def measure(model, context: int, formats: list[str], rounds: int, label: str) -> dict:
    prepare(model)
    vocab = model.config.vocab_size
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, vocab, (1, context)))
    kinds = ["own"] + formats
    best = {k: float("inf") for k in kinds}
    cpu = {k: float("inf") for k in kinds}  # process CPU time: less sensitive to other processes' load
    sizes = {}
    with torch.no_grad():
        for k in kinds:  # warm-up: numba compiles, torch allocates
            model(
                ids,
                cache=DynamicCache(config=model.config)
                if k == "own"
                else TbqCache(model.config, k, k, model_domain=False),
            )
        for _ in range(rounds):
            for k in kinds:
                cache = (
                    DynamicCache(config=model.config)
                    if k == "own"
                    else TbqCache(model.config, k, k, model_domain=False)
                )
                c0, t0 = time.process_time(), time.perf_counter()
                model(ids, cache=cache)
                best[k] = min(best[k], time.perf_counter() - t0)
                cpu[k] = min(cpu[k], time.process_time() - c0)
                if k != "own":
                    sizes[k] = (cache.nbytes, cache.bytes_per_token() * context)
    params = sum(p.numel() for p in model.parameters())
    print(f"\n{label}: {params / 1e6:.1f} M parameters, context {context}, best of {rounds} rounds")
    print(
        f"{'cache':<10} {'forward ms':>10} {'overhead':>9} {'CPU ms':>8} {'CPU over':>9} {'cache bytes':>12} "
        f"{'= B/token x tokens':>19}"
    )
    print(f"{'own':<10} {best['own'] * 1e3:>10.1f} {'':>9} {cpu['own'] * 1e3:>8.1f}")
    rows = {}
    for k in formats:
        over = (best[k] - best["own"]) / best["own"]
        cover = (cpu[k] - cpu["own"]) / cpu["own"]
        held, want = sizes[k]
        print(
            f"{k:<10} {best[k] * 1e3:>10.1f} {100 * over:>8.1f}% {cpu[k] * 1e3:>8.1f} {100 * cover:>8.1f}% "
            f"{held:>12,} {'yes' if held == want else 'NO':>19}"
        )
        rows[k] = {
            "ms": best[k] * 1e3,
            "overhead": over,
            "cpu_ms": cpu[k] * 1e3,
            "cpu_overhead": cover,
            "nbytes": held,
            "expected_nbytes": want,
        }
    return {
        "label": label,
        "params": params,
        "context": context,
        "rounds": rounds,
        "own_ms": best["own"] * 1e3,
        "own_cpu_ms": cpu["own"] * 1e3,
        "rows": rows,
    }


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--large-rounds", type=int, default=2)
    p.add_argument("--formats", default=DEFAULT_FORMATS)
    p.add_argument(
        "--large-formats", default="f16,q8_0,q4_0,tbq4_0,tbq3_0", help="the cache types timed on the large model"
    )
    p.add_argument("--no-large", action="store_true", help="skip the 0.43 B-parameter model")
    p.add_argument("--threads", type=int, default=2, help="torch's threads (1: steadier on a loaded machine)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    formats = args.formats.split(",")
    model, _ = load(tokenizer=False)
    load_before = os.getloadavg()
    out = [measure(model, args.context, formats, args.rounds, "shipped model")]
    if not args.no_large:
        out.append(
            measure(
                large_model(), args.context, args.large_formats.split(","), args.large_rounds, "random-weight Llama"
            )
        )
    machine = {
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    print(f"\n{machine}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "models": out}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
