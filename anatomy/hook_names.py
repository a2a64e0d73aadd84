"""TransformerLens's hook names and anatomy's trace points, both ways.

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
ALIASES = {
    "hook_embed": "embed",
    "hook_pos_embed": "pos_embed",
    "hook_token_type_embed": "type_embed",
    "blocks.L.hook_resid_pre": "blocks.L.resid_pre",
    "blocks.L.hook_resid_mid": "blocks.L.resid_mid",
    "blocks.L.hook_resid_post": "blocks.L.resid_post",
    "blocks.L.ln1.hook_normalized": "blocks.L.attn_norm.out",
    "blocks.L.ln2.hook_normalized": "blocks.L.mlp_norm.out",
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
    "ln_final.hook_normalized": "final_norm.out",
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


__all__ = ["ALIASES", "anatomy_name", "transformer_lens_name"]
