"""Analyses side by side with TransformerLens and Captum, on the same weights, one thread.

- activation patching: a resid_pre position sweep (every layer x every position), anatomy's
  batched patch against TransformerLens's patching.get_act_patch_resid_pre (one forward per cell);
- a full activation cache of random GPT-2-small weights on 1 x 128 tokens: anatomy.run_with_cache
  against TransformerLens's run_with_cache: time, peak memory, and the MB of distinct storage each
  cache holds after the pass (anatomy's derived points are recipes until read);
- integrated gradients on the token embeddings against Captum's LayerIntegratedGradients (same
  baseline, steps and Gauss-Legendre method).

Each row also reports the largest difference between the two results.
"""

from __future__ import annotations

import importlib.util
import statistics
import tempfile

import torch

from ..analysis import integrated_gradients, patch, run_with_cache
from .common import Row, Settings, alternate, gpt2_pair, memory_note, peak_memory_mb


def transformer_lens_pair(n_layers: int, d_model: int, n_heads: int, vocab_size: int = 50257, max_seq_len: int = 1024):
    """(anatomy DecoderModel, TransformerLens TransformerBridge) over the same random GPT-2 weights.

    The bridge wraps the transformers model that anatomy's copy was loaded from; nothing is downloaded."""
    from transformer_lens.model_bridge import TransformerBridge  # optional extra: analysis

    ours, theirs = gpt2_pair(n_layers, d_model, n_heads, vocab_size=vocab_size, max_seq_len=max_seq_len)
    with tempfile.TemporaryDirectory() as directory:
        theirs.config.save_pretrained(directory)
        bridge = TransformerBridge.boot_transformers(directory, hf_model=theirs)
    return ours, bridge.eval()


def _logit_difference(logits: torch.Tensor) -> torch.Tensor:
    """[B, T, V] -> [B]: logit of token 1 minus token 2 at the last position, a typical patching metric."""
    return logits[:, -1, 1] - logits[:, -1, 2]


def bench_patching(settings: Settings) -> Row:
    from transformer_lens import patching  # optional extra: analysis

    n_layers, d_model, n_heads, length = (2, 64, 4, 12) if settings.quick else (6, 256, 8, 24)
    ours, bridge = transformer_lens_pair(n_layers, d_model, n_heads, vocab_size=99 if settings.quick else 50257,
                                         max_seq_len=64)
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(0, ours.config.vocab_size, (1, length), generator=generator)
    corrupt = clean.clone()
    corrupt[0, length // 3] = (clean[0, length // 3] + 1) % ours.config.vocab_size
    with torch.no_grad():
        _, clean_cache = bridge.run_with_cache(clean)

    def theirs():
        with torch.no_grad():
            return patching.get_act_patch_resid_pre(bridge, corrupt, clean_cache, lambda x: _logit_difference(x).mean())

    def anatomy_side():  # the metric reads the last position: say so, and the LM head skips the others
        return patch(ours, clean, corrupt, point="resid_pre", metric=_logit_difference, logits_at="last").values

    def anatomy_all_logits():
        return patch(ours, clean, corrupt, point="resid_pre", metric=_logit_difference).values

    reference = theirs()
    error = max((reference - anatomy_side()).abs().max().item(), (reference - anatomy_all_logits()).abs().max().item())
    times = alternate({"anatomy": anatomy_side, "TransformerLens": theirs, "all logits": anatomy_all_logits},
                      settings.repeats or 3, warmup=0)
    ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
    row = Row("analysis", f"patching vs TransformerLens: resid_pre, {n_layers} layers x {length} positions, width {d_model}", "ms",
              ms["anatomy"], ms["TransformerLens"], False)
    row.notes = [f"{n_layers * length} patched runs; logits_at='last'; with every position's logits "
                 f"{ms['all logits']:.0f} ms ({ms['TransformerLens'] / ms['all logits']:.1f}x)",
                 f"max |diff| {error:.1e} (goal <= 1e-4, >= 3x)"]
    return row


def _stored_mb(tensors) -> float:
    """MB of the distinct storages behind `tensors` (views of one storage count once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values()) / 1e6


def bench_cache(settings: Settings) -> Row:
    n_layers, d_model, n_heads, length = (2, 64, 4, 16) if settings.quick else (12, 768, 12, 128)
    ours, bridge = transformer_lens_pair(n_layers, d_model, n_heads, vocab_size=99 if settings.quick else 50257,
                                         max_seq_len=max(64, length))
    ids = torch.randint(0, ours.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))

    def anatomy_side():
        return run_with_cache(ours, ids)

    def theirs():
        with torch.no_grad():
            return bridge.run_with_cache(ids)

    (logits, cache), (their_logits, their_cache) = anatomy_side(), theirs()
    held = _stored_mb(cache.stored())  # before reading anything: a recipe's value is kept once read
    last = f"blocks.{n_layers - 1}.hook_resid_post"  # a chain through every layer's residual stream
    error = max((logits.logits - their_logits).abs().max().item(), (cache[last] - their_cache[last]).abs().max().item())
    times = alternate({"anatomy": anatomy_side, "TransformerLens": theirs}, settings.repeats or 10, warmup=1)
    # a single peak moves by +-5% with the allocator's state: alternate, keep the medians
    peaks = {"anatomy": [], "transformers": []}
    for _ in range(1 if settings.quick else 5):
        for side, fn in (("anatomy", anatomy_side), ("transformers", theirs)):
            peaks[side].append(peak_memory_mb(fn))
    memory = {side: None if None in values else statistics.median(values) for side, values in peaks.items()}
    ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
    row = Row("analysis", f"full cache vs TransformerLens: GPT-2 {n_layers}x{d_model}, 1x{length}", "ms", ms["anatomy"],
              ms["TransformerLens"], False)
    row.notes = [f"{len(cache)} vs {len(their_cache)} tensors, {held:.1f} vs "
                 f"{_stored_mb(their_cache.values()):.1f} MB stored ({_stored_mb(cache.values()):.1f} MB once "
                 f"every derived point is read)",
                 memory_note(memory).replace("vs", "vs TL") + f" (medians of {len(peaks['anatomy'])})",
                 f"max |diff| {error:.1e} (goal >= 1.5x, memory <= 0.5x)"]
    return row


def bench_integrated_gradients(settings: Settings) -> Row:
    from captum.attr import LayerIntegratedGradients  # optional extra: analysis

    n_layers, d_model, n_heads, length, steps = (2, 64, 4, 8, 8) if settings.quick else (6, 256, 8, 24, 50)
    ours, _ = gpt2_pair(n_layers, d_model, n_heads, vocab_size=99 if settings.quick else 50257, max_seq_len=64)
    ids = torch.randint(1, ours.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    baseline = torch.zeros_like(ids)
    target = 7

    def anatomy_side():
        return integrated_gradients(ours, ids, target, baseline_ids=baseline, steps=steps)

    layer_ig = LayerIntegratedGradients(lambda x: ours(x).logits[:, -1, target], ours.token_embedding)

    def theirs():
        return layer_ig.attribute(ids, baselines=baseline, n_steps=steps, method="gausslegendre")

    result, their_attributions = anatomy_side(), theirs()
    reference = their_attributions.sum(-1)
    error = ((result.values - reference).abs().max() / reference.abs().max()).item()
    times = alternate({"anatomy": anatomy_side, "Captum": theirs}, settings.repeats or 3, warmup=1)
    ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
    row = Row("analysis", f"integrated gradients vs Captum: {steps} steps, GPT-2 {n_layers}x{d_model}, 1x{length}", "ms",
              ms["anatomy"], ms["Captum"], False)
    row.notes = [f"vs Captum LayerIntegratedGradients: max relative diff {error:.1e} (goal <= 1e-3)", result.check]
    return row


def bench_analysis(settings: Settings) -> list[Row]:
    """Patching and full cache against TransformerLens, integrated gradients against Captum (each
    when installed: pip install 'anatomy[analysis]')."""
    rows = []
    if importlib.util.find_spec("transformer_lens") is not None:
        rows += [bench_patching(settings), bench_cache(settings)]
    else:
        print("  analysis: transformer-lens is not installed; patching and cache rows skipped")
    if importlib.util.find_spec("captum") is not None:
        rows.append(bench_integrated_gradients(settings))
    else:
        print("  analysis: captum is not installed; the integrated-gradients row skipped")
    return rows
