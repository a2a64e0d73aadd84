"""Small helpers shared by the architecture files: reading HF config fields, activation names."""

from __future__ import annotations

from .files import CheckpointError

# Hugging Face activation name -> anatomy activation (only those that compute the same function).
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
# anatomy activation -> the name written back to config.json
TO_HF_ACTIVATION = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu"}


def field(hf: dict, name: str, model_type: str, default=None):
    """hf[name], or `default`; CheckpointError naming the field when it is absent and has no default."""
    value = hf.get(name, default)
    if value is None and default is None and name not in hf:
        raise CheckpointError(f"config.json of this {model_type} checkpoint lacks the field {name!r}")
    return value


def activation(hf: dict, name: str, model_type: str, default: str) -> str:
    value = hf.get(name, default)
    if value not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"{model_type} config has {name}={value!r}; supported: {', '.join(sorted(HF_ACTIVATIONS))}"
        )
    return HF_ACTIVATIONS[value]


def to_hf_activation(act: str, model_type: str) -> str:
    if act not in TO_HF_ACTIVATION:
        raise CheckpointError(f"a {model_type} checkpoint cannot express activation={act!r}")
    return TO_HF_ACTIVATION[act]


def unsupported(model_type: str, hf: dict, **allowed) -> None:
    """Raise for any HF option that changes the computation in a way anatomy does not model."""
    wrong = [f"{name}={hf[name]!r} (supported: {value!r})" for name, value in allowed.items()
             if name in hf and hf[name] is not None and hf[name] != value]
    if wrong:
        raise CheckpointError(f"this {model_type} checkpoint uses options anatomy does not implement: {', '.join(wrong)}")


def label_fields(config) -> dict:
    """config.json's id2label / label2id for a classification head (LABEL_0, LABEL_1, ...); {} for others."""
    if config.head not in ("sequence-classification", "token-classification"):
        return {}
    return {"id2label": {str(i): f"LABEL_{i}" for i in range(config.num_labels)},
            "label2id": {f"LABEL_{i}": i for i in range(config.num_labels)}}


def num_labels(hf: dict) -> int:
    labels = hf.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else int(hf.get("num_labels", 2))


def pad_id(hf: dict) -> int | None:
    """pad_token_id when it names a real token (GPT-2 configs often leave it unset or out of range)."""
    pad = hf.get("pad_token_id")
    return pad if isinstance(pad, int) and 0 <= pad < hf.get("vocab_size", 0) else None
