"""Features: sparse autoencoders and transcoders, loaded, attached to a pass, trained, measured and shown.

    sae = anatomy.load_sae("path/to/folder")          # SAELens's cfg.json + sae_weights.safetensors, params.npz, a Hub id
    with anatomy.trace(model, ["blocks.6.resid_post.sae.features"], saes={"blocks.6.resid_post": sae}) as t:
        model(ids)                                     # the outputs unchanged: x = reconstruction + error
    t["blocks.6.resid_post.sae.features"]              # [batch, pos, feature]

    modules.py     SAE: relu, topk, batchtopk, jumprelu; transcoders (and skip transcoders); encode, decode, splice
    formats.py     load_sae: SAELens's folder, Gemma Scope's params.npz, Hub ids
    saelens.py     save_sae (and SAE.save): SAELens's folder, its architecture names both ways
    transcoders.py TranscoderSet: transcoders on every layer, per-layer or cross-layer; the replacement model
    transcoder_files.py  load_transcoders / save_transcoders: circuit-tracer's sets, Gemma Scope's, Gemma Scope 2's
    transcoder_hub.py    sets by Hub id and by circuit-tracer's short names ("gemma", "llama"), only their files fetched
    transcoder_config.py circuit-tracer's config.yaml, read as bounded data
    gemma_scope_files.py Gemma Scope's params.npz and Gemma Scope 2's params.safetensors, as a set's layers
    transcoder_layers.py LazyLayers: a set's layers read from their files when first used, one at a time
    mapped.py      safetensors and npz files memory-mapped, every size checked from the headers first
    attach.py      interventions on features: zero, clamp, scale, steer, no_error
    analysis.py    features as components: feature_lens, feature_logit_attribution, patch_features,
                   feature_integrated_gradients
    store.py       activations harvested from passes that stop at the point, shuffled, sharded on disk
    objectives.py  the training losses by kind, and the sparse TopK step
    train.py       SAETrainer on the training floor (run folder, checkpoints, resume, torchrun); several at once
    member.py      one SAE in training: its scales, its dead-feature counts, the scales folded out at the end
    evaluate.py    L0, variance explained, CE loss recovered, dead and dense features; of a transcoder set
    contexts.py    where features fire hardest: each feature's top contexts, kept as a corpus streams by
    features.py    the feature page (top contexts, density, histogram, logits centred over the vocabulary)
    plots.py       training curves; variance explained against L0
    cli.py         `anatomy sae train | eval | features`
    cli_common.py  what the sae commands share: option groups, the model loaded and checked, a run's folder
    transcoders_cli.py  `anatomy sae train-transcoders | eval-transcoders`: every layer from one harvest
"""

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    **{name: ".attach" for name in ("clamp", "no_error", "scale", "steer", "zero")},
    "load_sae": ".formats", "save_sae": ".saelens",
    "KINDS": ".modules", "SAE": ".modules",
    "load_transcoders": ".transcoder_files", "save_transcoders": ".transcoder_files",
    "TranscoderSet": ".transcoders",
})
