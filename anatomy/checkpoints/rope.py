"""config.json's rotary settings, in the two spellings transformers has used.

    transformers 4.x   rope_theta (GPT-NeoX: rotary_emb_base) and rope_scaling (null, or
                       {"rope_type": "linear", "factor": 8.0}) at the top level; the rotated fraction
                       of each head there too (Phi-3: partial_rotary_factor, GPT-NeoX: rotary_pct);
                       Gemma 3's sliding layers rotate with rope_local_base_freq, unscaled
    transformers 5.x   rope_parameters: {"rope_type", "rope_theta", "factor", ..., "partial_rotary_factor"},
                       one per layer type for Gemma 3: {"full_attention": {...}, "sliding_attention": {...}}.
                       A top-level rope_scaling still replaces it; the top-level base and fraction
                       are read where it lacks them.

Each version ignores the other's keys without a word: transformers 4.57 loads a folder that holds only
rope_parameters and rotates with its own default base (SmolLM2's 100 000 became 10 000). So anatomy
writes both spellings, and reads either. A folder holding both that describe different rotations
computes two different models, one in each version: it is refused, with what each version reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from .files import CheckpointError

# rope_type -> the fields of its rope dict, and the ModelConfig fields they fill.
SCALING_FIELDS = {
    "default": {},
    "linear": {"factor": "rope_scaling_factor"},
    "llama3": {"factor": "rope_scaling_factor", "low_freq_factor": "rope_low_freq_factor",
               "high_freq_factor": "rope_high_freq_factor",
               "original_max_position_embeddings": "rope_original_max_len"},
}
LAYER_TYPES = ("full_attention", "sliding_attention")  # the keys of a rope_parameters given per layer type


@dataclass(frozen=True)
class Spelling:
    """Where one architecture's config.json keeps its rotary settings outside rope_parameters, and
    the defaults both versions of its config class use when a key is absent.

    theta: the top-level key of the base; fraction: of the rotated fraction of each head (None: the
    architecture rotates whole heads); local_theta: of the sliding layers' own base (Gemma 3)."""
    theta: str = "rope_theta"
    default_theta: float = 10_000.0
    fraction: str | None = None
    default_fraction: float = 1.0
    local_theta: str | None = None
    default_local_theta: float = 10_000.0


SPELLINGS = {
    "mixtral": Spelling(default_theta=1_000_000.0),
    "phi3": Spelling(fraction="partial_rotary_factor"),
    "gpt_neox": Spelling(theta="rotary_emb_base", fraction="rotary_pct", default_fraction=0.25),
    "gemma3_text": Spelling(default_theta=1_000_000.0, local_theta="rope_local_base_freq"),
}


def spelling(model_type: str) -> Spelling:
    return SPELLINGS.get(model_type, Spelling())


# reading -------------------------------------------------------------------------------------------

def _fields(rope: dict, model_type: str, where: str) -> dict:
    """One rope dict, its base and fraction resolved -> ModelConfig fields (and "fraction")."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in SCALING_FIELDS:
        raise CheckpointError(f"this {model_type} checkpoint uses rope_type={kind!r} ({where}); "
                              f"anatomy implements {', '.join(map(repr, SCALING_FIELDS))}")
    fields = {"rope_theta": float(rope["rope_theta"]), "fraction": float(rope["partial_rotary_factor"])}
    if kind != "default":
        fields["rope_scaling"] = kind
    for hf_name, name in SCALING_FIELDS[kind].items():
        if hf_name not in rope:
            raise CheckpointError(f"this {model_type} checkpoint's {kind} rope settings ({where}) lack {hf_name!r}")
        fields[name] = int(rope[hf_name]) if name == "rope_original_max_len" else float(rope[hf_name])
    return fields


def _as_version_5(hf: dict, spell: Spelling, layer: str | None) -> dict:
    """The rope dict transformers 5 builds for `layer` (None: every layer) from any spelling."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    if layer is None:
        rope = dict(scaling or params)  # a top-level rope_scaling replaces rope_parameters
    else:
        rope = dict(params.get(layer) or {"rope_type": "default"})
        rope.update(scaling if layer == "full_attention" else {})  # Gemma 3 scales its full layers
    local = layer == "sliding_attention"
    theta_key, default = (spell.local_theta, spell.default_local_theta) if local else (spell.theta, spell.default_theta)
    rope.setdefault("rope_theta", hf.get(theta_key, default))
    rope.setdefault("partial_rotary_factor", hf.get(spell.fraction, spell.default_fraction) if spell.fraction else 1.0)
    return rope


def _as_version_4(hf: dict, spell: Spelling, layer: str | None) -> dict:
    """The rope dict transformers 4 builds for `layer` from the top-level keys (it never reads rope_parameters)."""
    fraction = hf.get(spell.fraction, spell.default_fraction) if spell.fraction else 1.0
    if layer == "sliding_attention":
        return {"rope_type": "default", "rope_theta": hf.get(spell.local_theta, spell.default_local_theta),
                "partial_rotary_factor": fraction}
    return {**(hf.get("rope_scaling") or {"rope_type": "default"}), "rope_theta": hf.get(spell.theta, spell.default_theta),
            "partial_rotary_factor": fraction}


def _top_level_keys(hf: dict, spell: Spelling) -> list[str]:
    """The transformers-4 rotary keys this config holds."""
    keys = [spell.theta, spell.fraction, spell.local_theta]
    return [k for k in keys if k is not None and k in hf] + (["rope_scaling"] if hf.get("rope_scaling") else [])


def _one_rotation(hf: dict, spell: Spelling, model_type: str, layer: str | None) -> dict:
    """ModelConfig fields of `layer`'s rotation; CheckpointError when the two spellings disagree."""
    five = _fields(_as_version_5(hf, spell, layer), model_type, "rope_parameters")
    if not hf.get("rope_parameters") or not _top_level_keys(hf, spell):
        return five
    four = _fields(_as_version_4(hf, spell, layer), model_type, "rope_theta, rope_scaling")
    if four != five:
        which = f" for its {layer} layers" if layer else ""
        raise CheckpointError(
            f"this {model_type} checkpoint's config.json gives its rotary settings twice, and they differ{which}: "
            f"transformers 5 reads rope_parameters as {_summary(five)}, transformers 4 reads "
            f"{', '.join(_top_level_keys(hf, spell))} as {_summary(four)}. The folder computes a different model "
            "in each version; remove the spelling that is wrong")
    return five


def _summary(fields: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields.items())


def read_rope(hf: dict, model_type: str) -> dict:
    """config.json's rotary settings, either spelling -> ModelConfig fields (rope_theta, rope_scaling
    and its factors, rope_local_theta for Gemma 3) and "fraction", the rotated part of each head.

    Raises CheckpointError for a rope_type anatomy does not implement, a scaling that lacks a field,
    rope_parameters given per layer type where the architecture has one rotation (and they differ),
    and a folder whose two spellings disagree."""
    spell = spelling(model_type)
    params = hf.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"this {model_type} checkpoint's rope_parameters is {type(params).__name__}, not a mapping")
    nested = [key for key in LAYER_TYPES if key in (params or {})]
    if spell.local_theta:  # Gemma 3: one rotation for the full layers, another for the sliding ones
        if params and not nested:
            raise CheckpointError(f"this {model_type} checkpoint's rope_parameters must be given per layer type "
                                  f"({', '.join(LAYER_TYPES)}); it has {', '.join(map(repr, params))}")
        full = _one_rotation(hf, spell, model_type, "full_attention")
        local = _one_rotation(hf, spell, model_type, "sliding_attention")
        if "rope_scaling" in local or local["fraction"] != full["fraction"]:
            raise CheckpointError(f"this {model_type} checkpoint scales (or partly rotates) its sliding layers "
                                  f"({_summary(local)}); anatomy implements that for the full layers only")
        return dict(full, rope_local_theta=local["rope_theta"])
    if nested:
        ropes = [_one_rotation(hf, spell, model_type, key) for key in nested]
        if any(rope != ropes[0] for rope in ropes):
            raise CheckpointError(f"this {model_type} checkpoint rotates each layer type differently "
                                  f"({'; '.join(map(_summary, ropes))}); anatomy implements that for gemma3_text only")
        return ropes[0]
    return _one_rotation(hf, spell, model_type, None)


# writing -------------------------------------------------------------------------------------------

def _rope_dict(config: ModelConfig) -> dict:
    """The rope dict of the (full layers') rotation: rope_type, rope_theta and the scaling's fields."""
    kind = "default" if config.rope_scaling == "none" else config.rope_scaling
    return {"rope_type": kind, "rope_theta": config.rope_theta,
            **{hf_name: getattr(config, name) for hf_name, name in SCALING_FIELDS[kind].items()}}


def write_rope(config: ModelConfig, model_type: str) -> dict:
    """The inverse of read_rope, in both spellings: rope_parameters for transformers 5 and the
    top-level keys for transformers 4 (rope_scaling null when unscaled, as 4.x writes it)."""
    spell = spelling(model_type)
    rope = _rope_dict(config)
    fraction = config.rotary_dim / config.d_head
    if spell.fraction:
        rope["partial_rotary_factor"] = fraction
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    legacy = {spell.theta: config.rope_theta, "rope_scaling": scaling if scaling["rope_type"] != "default" else None}
    if spell.fraction:
        legacy[spell.fraction] = fraction
    if not spell.local_theta:
        return {"rope_parameters": rope, **legacy}
    local = config.rope_theta if config.rope_local_theta is None else config.rope_local_theta
    return {"rope_parameters": {"full_attention": rope,
                                "sliding_attention": {"rope_type": "default", "rope_theta": local}},
            spell.local_theta: local, **legacy}
