"""The mutation catalogue: one plausible bug per entry, and the tests expected to catch it.

``old`` must occur exactly once in ``file`` (``benchmarks/mutation.py --check``
says which entries went stale when the code moved). Every module that is
added or rewritten adds or updates its entries here. ``tests`` are pytest
node ids or files (no ``-k``: the baseline runs their union).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    package: str
    file: str
    old: str
    new: str
    tests: tuple
    why: str = ""


def M(name, package, file, old, new, tests, why=""):
    return Mutant(name, package, file, old, new, tuple(tests.split()) if isinstance(tests, str) else tuple(tests), why)


S = "src/tbq/"
AROUND = "tests/test_around_the_codecs.py"

CATALOGUE = [
    # --- formats: the NumPy specs -------------------------------------------------------------
    M("q8_0_divisor", "formats", S + "formats/q8_0.py",
      "        d = amax / _127\n", "        d = amax / F32(128.0)\n",
      "tests/test_format_q8_0.py", "scale amax/128 instead of amax/127"),
    M("q4_0_offset", "formats", S + "formats/q4_0.py",
      "        t = v + _8_5  # two roundings", "        t = v + F32(8.0)  # two roundings",
      "tests/test_format_q4_0.py", "truncation offset 8 instead of 8.5 (rounds down)"),
    M("q4_0_decode_offset", "formats", S + "formats/q4_0.py",
      "q = _np_unpack4_halves(data[:, 2:]).astype(np.float32) - F32(8)",
      "q = _np_unpack4_halves(data[:, 2:]).astype(np.float32) - F32(7)",
      "tests/test_format_q4_0.py", "decoder's code offset off by one"),
    M("q4_0_zero_block_sign", "formats", S + "formats/q4_0.py",
      "        m[a.max(axis=1) == 0] = F32(0)\n", "        m[a.max(axis=1) == 0] = F32(-0.0)\n",
      "tests/test_format_q4_0.py", "all-zero block stores d = +0 (00 00) instead of ggml's -0 (00 80)"),
    M("q4_1_half", "formats", S + "formats/q4_1.py",
      "_HALF = F32(0.5)\n", "_HALF = F32(0.4999999)\n",
      "tests/test_format_q4_1.py", "round-half-up offset a hair below 1/2"),
    M("tbq_recon_pairwise_sum", "formats", S + "formats/tbq.py",
      "        recon = np.sqrt(seq_sum_squares(self.codebook.centroids[idx]))",
      "        recon = np.sqrt(np.sum(self.codebook.centroids[idx] ** 2, axis=1))",
      "tests/test_format_tbq.py", "NumPy's pairwise sum instead of the C loop's sequential sum"),
    M("iq4_nl_tiny", "formats", S + "formats/iq4_nl.py",
      "_TINY = F32(1e-15)", "_TINY = F32(1e-14)",
      "tests/test_format_iq4_nl.py", "tiny-block threshold off by a decade"),
    M("mxfp4_log2_in_float64", "formats", S + "formats/fp4.py",
      "    return np.floor(np.log2(a.astype(np.float64)).astype(np.float32)).astype(np.int32)",
      "    return np.floor(np.log2(a.astype(np.float64))).astype(np.int32)",
      "tests/test_format_fp4.py", "log2 without the float32 rounding of log2f (binade tops)"),
    M("bf16_round_to_odd_bit", "formats", S + "formats/f16.py",
      "    h = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)",
      "    h = (u + np.uint32(0x8000)) >> np.uint32(16)",
      "tests/test_format_f16.py", "bf16 ties away from zero instead of to even"),
    # --- kernels: the numba twins --------------------------------------------------------------
    M("kernel_q8_0_divisor", "kernels", S + "formats/q8_0_kernels.py",
      "d = np.uint32(AB[l]).view(np.float32) / _127", "d = np.uint32(AB[l]).view(np.float32) / np.float32(127.5)",
      "tests/test_format_q8_0.py", "numba kernel's scale differs from the spec"),
    M("kernel_q4_0_offset", "kernels", S + "formats/q4_0_kernels.py",
      "                q0 = f32_to_int32(p0 + _8_5)", "                q0 = f32_to_int32(p0 + np.float32(8.4999))",
      "tests/test_format_q4_0.py", "numba kernel's even lanes use another offset"),
    M("kernel_pack4_nibbles_swapped", "kernels", S + "packing_kernels.py",
      "    return np.uint8((np.int32(lo) | (np.int32(hi) << 4)) & 0xFF)",
      "    return np.uint8((np.int32(hi) | (np.int32(lo) << 4)) & 0xFF)",
      "tests/test_rotation_codebooks_packing.py tests/test_format_q4_0.py", "low and high nibble swapped in the lane helper"),
    M("kernel_f16_tie_to_odd", "kernels", S + "kernels.py",
      "    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (h & np.uint32(1)) != 0):",
      "    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (h & np.uint32(1)) == 0):",
      "tests/test_format_f16.py " + AROUND + "::test_numba_fp16_conversion_rounds_every_tie_to_even",
      "the numba fp16 conversion (q4_1/q5/iq4_nl/planar-iso scales) rounds normal ties to odd"),
    M("kernel_f16_subnormal_tie", "kernels", S + "kernels.py",
      "        if rem > half or (rem == half and (q & np.uint32(1)) != 0):",
      "        if rem > half or (rem == half and (q & np.uint32(1)) == 0):",
      AROUND + "::test_numba_fp16_conversion_rounds_every_tie_to_even",
      "the numba fp16 conversion rounds subnormal ties to odd"),
    M("kernel_attention_scale", "kernels", S + "attention_kernels.py",
      "                    sr[t] = sr[t] * scale", "                    sr[t] = sr[t] * scale * np.float32(1.0001)",
      "tests/test_attention_kernel.py", "the fused kernel scales scores differently from the reference"),
    # --- codecs --------------------------------------------------------------------------------
    M("codecs_threaded_error_order", "codecs", S + "codecs.py",
      "        for r in _run_chunks(n_units, chunk, threads, work, min_units):",
      "        for r in reversed(_run_chunks(n_units, chunk, threads, work, min_units)):",
      AROUND + "::test_threaded_encode_reports_the_first_bad_block_in_input_order",
      "with threads, the error of the last chunk is raised, not the first"),
    M("codecs_numpy_first_bad_block", "codecs", S + "codecs.py",
      "                first_bad = int(np.argmax(~np.isfinite(xc).all(axis=1)))",
      "                first_bad = int(xc.shape[0] - 1 - np.argmax(~np.isfinite(xc[::-1]).all(axis=1)))",
      "tests/test_properties.py tests/test_errors.py", "NumPy backend names the last non-finite block of a chunk"),
    # --- rotation, codebooks, half, packing ------------------------------------------------------
    M("fwht_difference_reversed", "rotation", S + "rotation.py",
      "        np.subtract(a, b, out=blocks[:, :, 1, :])  # a - b",
      "        np.subtract(b, a, out=blocks[:, :, 1, :])  # a - b",
      "tests/test_rotation_codebooks_packing.py", "butterfly computes b - a"),
    M("lloyd_max_threshold_not_midpoint", "codebooks", S + "codebooks.py",
      "        edges = np.concatenate(([-np.inf], 0.5 * (c[1:] + c[:-1]), [np.inf]))",
      "        edges = np.concatenate(([-np.inf], 0.4999 * (c[1:] + c[:-1]), [np.inf]))",
      "tests/test_rotation_codebooks_packing.py", "Lloyd-Max cells not split at the midpoints"),
    M("f16_table_flushes_subnormals", "half", S + "half.py",
      "    t.setflags(write=False)\n    return t",
      "    t = np.where((np.arange(65536) & 0x7C00) == 0, np.copysign(np.float32(0), t), t).astype(np.float32)\n"
      "    t.setflags(write=False)\n    return t",
      "tests/test_properties.py::test_decode_arbitrary_bytes", "fp16 table flushes subnormals to zero (shared by both backends)"),
    M("pack3_lane_shift", "packing", S + "packing_kernels.py",
      "        store_lane3(out, 3 * g, lane3(idx[i], idx[i + 1], idx[i + 2], idx[i + 3], idx[i + 4], idx[i + 5], idx[i + 6], idx[i + 7]))",
      "        store_lane3(out, 3 * g, lane3(idx[i + 1], idx[i], idx[i + 2], idx[i + 3], idx[i + 4], idx[i + 5], idx[i + 6], idx[i + 7]))",
      "tests/test_tbq3_shift_bug.py", "two indices of a 3-bit lane swapped"),
    # --- golden ----------------------------------------------------------------------------------
    M("golden_manifest_drops_negative_zero", "golden", S + "golden/manifest.py",
      '        return ("-" if math.copysign(1.0, v) < 0 else "") + "0x0p+0" + suffix',
      '        return "0x0p+0" + suffix',
      "tests/test_golden.py", "the manifest's hex floats lose the sign of -0"),
    M("golden_band_without_floor", "golden", S + "formats/base.py",
      "    w = k * ulp32(np.maximum(np.abs(v64), floor))", "    w = k * ulp32(np.abs(v64))",
      "tests/test_golden.py", "fragility band ignores the ulp floor"),
    # --- check -----------------------------------------------------------------------------------
    M("check_fragile_reported_exact", "check", S + "check/classify.py",
      "    return np.where(ok, FRAGILE, WRONG).astype(np.uint8)", "    return np.where(ok, EXACT, WRONG).astype(np.uint8)",
      "tests/test_check.py", "a differing block within the fragility masks counts as exact"),
    M("check_nibble_swap_diagnosis", "check", S + "check/diagnose.py",
      "    return ((b >> 4) | (b << 4)).astype(np.uint8)", "    return ((b >> 4) | (b << 3)).astype(np.uint8)",
      "tests/test_check.py", "the swapped-nibble diagnosis builds the wrong candidate"),
    # --- strategies ------------------------------------------------------------------------------
    M("strategies_inverse_overflow_range", "strategies", S + "testing/strategies.py",
      "        target = 2.0 ** draw(st.floats(-140.0, -128.5))", "        target = 2.0 ** draw(st.floats(-127.5, -120.0))",
      "tests/test_strategies.py::test_subnormal_family_gives_normal_blocks_whose_inverse_scale_overflows",
      "the inverse-overflow mode no longer makes 1/d overflow"),
    M("strategies_no_rotated_one_hot", "strategies", S + "testing/strategies.py",
      '    modes = ["one_hot", "spikes"] + (["rotated_one_hot"] if ctx.rotation is not None else [])',
      '    modes = ["one_hot", "spikes"]',
      "tests/test_strategies.py::test_sparse_family_gives_dense_blocks_that_rotate_to_an_exact_one_hot",
      "the sparse family lost its rotated one-hots"),
    M("strategies_min_ties_off_tie", "strategies", S + "testing/strategies.py",
      "    blk[:] = (float(mn) + (k + 0.5) * d)", "    blk[:] = (float(mn) + (k + 0.45) * d)",
      "tests/test_strategies.py::test_min_ties_family_gives_exact_ties_in_many_draws", "min_ties values no longer on ties"),
    M("strategies_heavy_tail_is_gaussian", "strategies", S + "testing/strategies.py",
      "        return (rng.standard_t(df, ctx.bs) * scale).astype(F32)",
      "        return (rng.standard_normal(ctx.bs) * scale).astype(F32)",
      "tests/test_strategies.py::test_gaussian_and_heavy_tail_families_have_their_tails", "heavy_tail draws Gaussian values"),
    M("strategies_ue4m3_off_boundary", "strategies", S + "testing/strategies.py",
      "            s = (1 + (mnt + 0.5) / 8) * 2.0 ** (ue - 7)", "            s = (1 + (mnt + 0.25) / 8) * 2.0 ** (ue - 7)",
      "tests/test_strategies.py::test_each_family_keeps_its_promise", "UE4M3 scales a quarter step off the boundary"),
    M("strategies_few_special_scales", "strategies", S + "testing/strategies.py",
      "        names = list(SPECIAL_SCALES)\n", "        names = list(SPECIAL_SCALES)[:6]\n",
      "tests/test_strategies.py::test_arbitrary_encoded_blocks_cover_every_special_scale", "only 6 of the 13 special scales injected"),
    # --- attention -------------------------------------------------------------------------------
    M("attention_default_scale", "attention", S + "attention.py",
      "        scale = 1.0 / math.sqrt(dim)", "        scale = 1.0 / math.sqrt(dim + 1)",
      "tests/test_attention.py", "softmax scale 1/sqrt(d+1)"),
    M("attention_gqa_head_map", "attention", S + "attention.py",
      "    kv_of_head = np.arange(n_head) // (n_head // k.n_head_kv)",
      "    kv_of_head = np.arange(n_head) % k.n_head_kv",
      "tests/test_attention.py tests/test_attention_kernel.py", "query heads mapped to KV heads round-robin, not in groups"),
    # --- metrics ---------------------------------------------------------------------------------
    M("metrics_output_nmse_axis", "metrics", S + "metrics.py",
      "        se = np.sum((ob - oa) ** 2, axis=-1)\n        sx = np.sum(oa * oa, axis=-1)",
      "        se = np.sum((ob - oa) ** 2, axis=0)\n        sx = np.sum(oa * oa, axis=0)",
      AROUND + "::test_per_output_attention_statistics_are_over_each_query_and_head",
      "per-output NMSE over the query axis instead of each output vector"),
    M("metrics_output_p90", "metrics", S + "metrics.py",
      '        out["output_nmse_p90"] = float(np.quantile(per, 0.9))', '        out["output_nmse_p90"] = float(np.quantile(per, 0.95))',
      AROUND + "::test_per_output_attention_statistics_are_over_each_query_and_head", "the 95th percentile reported as p90"),
    M("metrics_output_cosine_pooled", "metrics", S + "metrics.py",
      '        out["output_cosine"] = float(np.mean(cosine_similarity(oa, ob)))',
      '        out["output_cosine"] = float(np.mean(cosine_similarity(oa.reshape(-1, oa.shape[-1]).T, ob.reshape(-1, ob.shape[-1]).T)))',
      AROUND + "::test_per_output_attention_statistics_are_over_each_query_and_head", "cosine per channel, not per output vector"),
    M("metrics_reverse_kl", "metrics", S + "metrics.py",
      "    kl = np.sum(np.exp(la) * (la - lb), axis=axis)", "    kl = np.sum(np.exp(lb) * (lb - la), axis=axis)",
      "tests/test_metrics.py", "KL(p_hat || p) instead of KL(p || p_hat)"),
    # --- study, synthetic, compare, plots ------------------------------------------------------
    M("study_rotation_sigma", "study", S + "study.py",
      "        sigma = 1.0 / math.sqrt(self.block_size)", "        sigma = 1.0 / self.block_size",
      "tests/test_study.py", "the rotated Lloyd-Max quantizer assumes the wrong coordinate spread"),
    M("synthetic_t_not_unit_variance", "study", S + "synthetic.py",
      "    return (t * math.sqrt((df - 2.0) / df)).astype(np.float32)", "    return t.astype(np.float32)",
      "tests/test_synthetic.py", "Student-t values not rescaled to unit variance"),
    M("compare_query_scale", "study", S + "compare.py",
      "    return out * (1.0 / math.sqrt(HEAD_DIM))", "    return out",
      "tests/test_cli_compare.py tests/test_compare_kernels.py", "compare's queries not scaled by 1/sqrt(head_dim)"),
    # --- budget, units ---------------------------------------------------------------------------
    M("budget_fits_strict", "budget", S + "budget.py",
      "        fits=headroom >= 0,", "        fits=headroom > 0,",
      AROUND + "::test_a_cache_exactly_the_size_of_the_free_memory_fits", "a cache exactly the free memory does not fit"),
    M("budget_max_context_ceil", "budget", S + "budget.py",
      "    max_context = max(0, math.floor(available / (kv * seqs)))", "    max_context = max(0, math.ceil(available / (kv * seqs)))",
      "tests/test_budget.py " + AROUND, "largest context rounded up"),
    M("units_carry_boundary", "budget", S + "units.py",
      "    if float(s) >= base and i < len(units) - 1:", "    if float(s) > base and i < len(units) - 1:",
      "tests/test_budget.py", "1023.999 KiB printed as 1024.00 KiB"),
    # --- numcodecs, dask -----------------------------------------------------------------------
    M("numcodecs_max_ndim", "numcodecs", S + "numcodecs.py",
      "_MAX_NDIM = 32\n", "_MAX_NDIM = 31\n",
      AROUND + "::test_an_array_with_the_most_axes_the_header_allows_round_trips", "one axis fewer than the header allows"),
    M("numcodecs_header_ndim_check", "numcodecs", S + "numcodecs.py",
      "    if not 1 <= ndim <= _MAX_NDIM:", "    if not 1 <= ndim < _MAX_NDIM:",
      AROUND + "::test_an_array_with_the_most_axes_the_header_allows_round_trips", "the decoder refuses 32-axis headers"),
    M("dask_partial_step_dropped", "dask", S + "dask.py",
      "    for s in range(0, xf.size, METRICS_STEP):", "    for s in range(0, max(xf.size // METRICS_STEP * METRICS_STEP, min(xf.size, METRICS_STEP)), METRICS_STEP):",
      AROUND + "::test_dask_block_statistics_include_the_last_partial_step", "whole steps only: the tail of a long chunk is ignored"),
    M("dask_max_summed", "dask", S + "dask.py",
      "    mx = stats[..., 2].max()", "    mx = stats[..., 2].sum()",
      "tests/test_dask.py", "max abs error summed over chunks"),
    # --- cli -------------------------------------------------------------------------------------
    M("cli_interrupt_status", "cli", S + "cli/__init__.py",
      "        return 130\n", "        return 1\n",
      "tests/test_cli_signals.py", "Ctrl-C exits 1"),
    M("cli_library_error_status", "cli", S + "cli/__init__.py",
      "        print(f\"{prog}: error: {' '.join(str(exc).split())}\", file=sys.stderr)\n        return 2",
      "        print(f\"{prog}: error: {' '.join(str(exc).split())}\", file=sys.stderr)\n        return 1",
      "tests/test_cli_compare.py tests/test_golden.py", "a library error exits 1 instead of 2"),
    # --- hf (tbq eval) ---------------------------------------------------------------------------
    M("hf_q8_0_query_scale", "hf", S + "hf/engine.py",
      "    d = (amax / 127.0).to(torch.float16)", "    d = (amax / 128.0).to(torch.float16)",
      "tests/test_hf_cache.py", "llama.cpp engine's Q quantization uses amax/128"),
    M("hf_hadamard_norm", "hf", S + "hf/engine.py",
      "    return h / math.sqrt(n)", "    return h / n",
      "tests/test_hf_cache.py", "attention rotation matrix not orthonormal"),
    M("hf_residual_window", "hf", S + "hf/cache.py",
      "        if self.resid is None or self.resid.shape[1] <= residual:",
      "        if self.resid is None or self.resid.shape[1] < residual:",
      "tests/test_hf_cache.py", "the residual window holds one token fewer"),
    M("eval_ppl_median", "hf", S + "hf/evaluate.py",
      "        ppl = float(math.exp(nll.mean()))", "        ppl = float(math.exp(np.median(nll)))",
      "tests/test_hf_cache.py tests/test_cli_eval.py", "perplexity from the median NLL"),
    M("eval_scored_half", "hf", S + "hf/evaluate.py",
      "        self.first = chunks.shape[1] // 2", "        self.first = chunks.shape[1] // 4",
      "tests/test_hf_cache.py tests/test_cli_eval.py", "scores three quarters of each chunk, not the second half (llama-perplexity)"),
    M("eval_kl_direction", "hf", S + "hf/evaluate.py",
      "            kl.append(torch.clamp((p * (base - lp)).sum(-1), min=0.0).numpy())",
      "            kl.append(torch.clamp((lp.exp() * (lp - base)).sum(-1), min=0.0).numpy())",
      "tests/test_hf_cache.py", "KL against the baseline in the wrong direction"),
]
