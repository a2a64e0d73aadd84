"""TransformerLens's (and circuit-tracer's) hook names and anatomy's trace points, both ways.

Any name a TransformerLens user types (blocks.3.hook_resid_post, blocks.*.attn.hook_pattern) is
read as anatomy's point (blocks.3.resid_post, blocks.*.attn.pattern) wherever a trace point is named;
anatomy's points are written back as TransformerLens names where a peer's format wants them (an
SAE saved in SAELens's format names its hook).
"""

from __future__ import annotations

import re

# TransformerLens hook name -> anatomy trace point, per block (L) or for the whole model. The
# axes are anatomy's: q, k and v are [batch head pos d_head] here, [batch pos head d_head] there;
# TransformerLens's attn_scores are masked (-inf above the diagonal), anatomy's `scores` are not.
# hook_normalized is a norm's x / rms (LayerNorm: centred, / std) BEFORE its gain and bias, as in
# TransformerLens's RMSNorm and its folded LayerNorm: anatomy's `<norm>.normalized` (on request);
# the norm's output after the gain, what the sublayer reads, is `<norm>.out` (no TransformerLens name).
ALIASES = {
    "hook_embed": "embed",
    "hook_pos_embed": "pos_embed",
    "hook_token_type_embed": "type_embed",
    "blocks.L.hook_resid_pre": "blocks.L.resid_pre",
    "blocks.L.hook_resid_mid": "blocks.L.resid_mid",
    "blocks.L.hook_mlp_in": "blocks.L.mlp_in",
    "blocks.L.hook_resid_post": "blocks.L.resid_post",
    "blocks.L.ln1.hook_normalized": "blocks.L.attn_norm.normalized",
    "blocks.L.ln2.hook_normalized": "blocks.L.mlp_norm.normalized",
    "blocks.L.attn.hook_q": "blocks.L.attn.q",
    "blocks.L.attn.hook_k": "blocks.L.attn.k",
    "blocks.L.attn.hook_v": "blocks.L.attn.v",
    "blocks.L.attn.hook_rot_q": "blocks.L.attn.q_rot",
    "blocks.L.attn.hook_rot_k": "blocks.L.attn.k_rot",
    "blocks.L.attn.hook_attn_scores": "blocks.L.attn.scores",
    "blocks.L.attn.hook_pattern": "blocks.L.attn.pattern",
    "blocks.L.attn.hook_z": "blocks.L.attn.z",
    "blocks.L.attn.hook_result": "blocks.L.attn.head_out",
    "blocks.L.hook_attn_out": "blocks.L.attn.out",
    "blocks.L.mlp.hook_pre": "blocks.L.mlp.pre",
    "blocks.L.mlp.hook_post": "blocks.L.mlp.post",
    "blocks.L.hook_mlp_out": "blocks.L.mlp.out",
    "ln_final.hook_normalized": "final_norm.normalized",
}
_ALIAS_PATTERNS = [
    (re.compile("^" + re.escape(tl).replace("L", r"(\d+|\*)") + "$"), ours) for tl, ours in ALIASES.items()
]


def anatomy_name(name: str) -> str:
    """The anatomy name for a TransformerLens hook name (or pattern); any other name unchanged."""
    for pattern, ours in _ALIAS_PATTERNS:
        match = pattern.match(name)
        if match:
            return ours.replace("L", match.group(1)) if match.groups() else ours
    return name


_INVERSE_PATTERNS = [
    (re.compile("^" + re.escape(ours).replace("L", r"(\d+)") + "$"), tl) for tl, ours in ALIASES.items()
]


def transformer_lens_name(name: str) -> str:
    """The TransformerLens hook name of an anatomy point (blocks.3.resid_post -> blocks.3.hook_resid_post);
    a name the table lacks unchanged."""
    for pattern, tl in _INVERSE_PATTERNS:
        match = pattern.match(name)
        if match:
            return tl.replace("L", match.group(1)) if match.groups() else tl
    return name


# circuit-tracer's feature hooks (config.yaml's feature_input_hook and feature_output_hook), named inside
# block L, -> anatomy's point. mlp.hook_in and mlp.hook_out are its ReplacementMLP's own hooks, around the MLP
# (its Llama transcoders name them); the others are TransformerLens's. The first name of a point is the one
# written. In a block whose MLP output has a norm of its own (Gemma's sandwich), TransformerLens's
# hook_mlp_out is that norm's output: `circuit_tracer_point` takes the block's layout.
CIRCUIT_TRACER_HOOKS = {
    "mlp.hook_in": "blocks.L.mlp_norm.out",
    "ln2.hook_normalized": "blocks.L.mlp_norm.normalized",
    "hook_resid_mid": "blocks.L.resid_mid",
    "mlp.hook_out": "blocks.L.mlp.out",
    "hook_mlp_out": "blocks.L.mlp.out",
}
# Hugging Face module outputs as Gemma Scope 2's config.json names them (model.layers.L.<module>.output).
HF_MODULE_OUTPUTS = {
    "pre_feedforward_layernorm": "blocks.L.mlp_norm.out",
    "post_feedforward_layernorm": "blocks.L.mlp_out_norm.out",
    "mlp": "blocks.L.mlp.out",
}


def circuit_tracer_point(hook: str, layer: int, mlp_out_norm: bool = False) -> str:
    """anatomy's point for circuit-tracer's `hook` in block `layer` ("mlp.hook_in", 3 -> blocks.3.mlp_norm.out);
    mlp_out_norm: the block normalises its MLP's output (then hook_mlp_out is that norm's output). Raises
    ValueError naming the allowed hooks."""
    if hook not in CIRCUIT_TRACER_HOOKS:
        raise ValueError(f"circuit-tracer hook {hook!r} is not one anatomy maps; allowed: {', '.join(CIRCUIT_TRACER_HOOKS)}")
    point = "blocks.L.mlp_out_norm.out" if hook == "hook_mlp_out" and mlp_out_norm else CIRCUIT_TRACER_HOOKS[hook]
    return point.replace("L", str(layer))


def circuit_tracer_hook(point: str) -> str:
    """circuit-tracer's name, inside its block, for anatomy's point (blocks.3.mlp.out -> mlp.hook_out);
    ValueError for a point circuit-tracer has no hook for."""
    pattern = re.sub(r"^blocks\.\d+\.", "blocks.L.", point)
    if pattern == "blocks.L.mlp_out_norm.out":
        return "hook_mlp_out"
    for hook, ours in CIRCUIT_TRACER_HOOKS.items():
        if ours == pattern:
            return hook
    allowed = sorted(set(CIRCUIT_TRACER_HOOKS.values()) | {"blocks.L.mlp_out_norm.out"})
    raise ValueError(f"circuit-tracer has no feature hook for {point!r}; it has hooks for {', '.join(allowed)}")


def hf_module_point(name: str) -> str:
    """anatomy's point for a Hugging Face module output (model.layers.3.pre_feedforward_layernorm.output ->
    blocks.3.mlp_norm.out); ValueError naming the modules known."""
    match = re.fullmatch(r"(?:model\.)?(?:language_model\.)?layers\.(\d+)\.(\w+)\.output", name)
    if not match or match.group(2) not in HF_MODULE_OUTPUTS:
        raise ValueError(f"Hugging Face module output {name!r} is not one anatomy maps; allowed: "
                         f"model.layers.L.{{{', '.join(HF_MODULE_OUTPUTS)}}}.output")
    return HF_MODULE_OUTPUTS[match.group(2)].replace("L", match.group(1))


__all__ = ["ALIASES", "CIRCUIT_TRACER_HOOKS", "HF_MODULE_OUTPUTS", "anatomy_name", "circuit_tracer_hook",
           "circuit_tracer_point", "hf_module_point", "transformer_lens_name"]
