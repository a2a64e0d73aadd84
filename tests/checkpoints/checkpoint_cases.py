"""Tiny random Hugging Face models for the checkpoint tests: the cases and how they are made.

Every parameter, norms and biases included, is drawn at random with a spread large enough that a
wrong mapping (a swapped q/k, a missing transpose, a bias on the wrong layer) shows in the outputs:
transformers' own initialisation (std 0.02, unit norms, zero biases) would hide most of them.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

VOCAB = 99
PAD = VOCAB - 1

# case name -> (transformers class, config class, config fields)
CASES = {
    "bert": ("BertModel", "BertConfig", {}),
    "bert-mlm": ("BertForMaskedLM", "BertConfig", {}),
    "bert-classify": ("BertForSequenceClassification", "BertConfig", {"num_labels": 3}),
    "bert-tokens": ("BertForTokenClassification", "BertConfig", {"num_labels": 5, "hidden_act": "gelu_new"}),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {}),
    "gpt2-untied": ("GPT2LMHeadModel", "GPT2Config", {"tie_word_embeddings": False, "n_inner": 48}),
    "gpt2-base": ("GPT2Model", "GPT2Config", {}),
    "marian": ("MarianMTModel", "MarianConfig", {"scale_embedding": True, "activation_function": "swish"}),
    "marian-gelu": ("MarianMTModel", "MarianConfig", {"scale_embedding": False, "activation_function": "gelu"}),
    "llama-gqa": ("LlamaForCausalLM", "LlamaConfig", {"num_key_value_heads": 2}),
    "llama-tied": ("LlamaForCausalLM", "LlamaConfig", {"tie_word_embeddings": True, "rope_theta": 500000.0}),
    "llama-bias": ("LlamaForCausalLM", "LlamaConfig",
                   {"attention_bias": True, "mlp_bias": True, "head_dim": 16, "num_key_value_heads": 1}),
    "llama-base": ("LlamaModel", "LlamaConfig", {"num_key_value_heads": 2}),
}


def tiny_config(transformers, config_class: str, fields: dict):
    base = {
        "BertConfig": dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=64, type_vocab_size=2),
        "GPT2Config": dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           bos_token_id=0, eos_token_id=0),
        "MarianConfig": dict(vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=32, encoder_layers=2,
                             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                             encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
                             pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=0),
        "LlamaConfig": dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=37, max_position_embeddings=64, bos_token_id=0, eos_token_id=0),
    }[config_class]
    fields = dict(fields)
    if "rope_theta" in fields:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": fields.pop("rope_theta")}
    return getattr(transformers, config_class)(**{**base, **fields})


def randomise(model, seed: int = 0) -> None:
    """Every parameter (and the logits bias buffer) drawn at random; norm gains around 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tensors = dict(model.named_parameters())
        tensors.update({n: b for n, b in model.named_buffers() if n.endswith("final_logits_bias")})
        for name, tensor in tensors.items():
            noise = torch.randn(tensor.shape, generator=generator) * 0.2
            is_gain = ("norm" in name.lower()) and name.endswith("weight")
            tensor.copy_(1.0 + noise if is_gain else noise)


def random_ids(shape, seed: int = 1) -> torch.Tensor:
    """Token ids drawn from 2..VOCAB-2: never a special id of the tiny configs, never PAD."""
    return torch.randint(2, VOCAB - 1, shape, generator=torch.Generator().manual_seed(seed))


def _plain_config(transformers, config_class: str, fields: dict):
    return getattr(transformers, config_class)(**fields)


def checkpoint_factory(cases: dict, tmp_path_factory, make_config=_plain_config):
    """make(case) -> the folder of a saved random transformers model of cases[case], built on first use.

    cases: name -> (transformers class, config class, config fields); the field `_untie_head=True`
    gives the model an lm_head of its own, as a Flan-T5 checkpoint stores one.
    """
    transformers = pytest.importorskip("transformers")
    made = {}

    def make(case: str):
        if case not in made:
            class_name, config_class, fields = cases[case]
            fields = dict(fields)
            untie = fields.pop("_untie_head", False)
            torch.manual_seed(0)
            model = getattr(transformers, class_name)(make_config(transformers, config_class, fields)).eval()
            randomise(model)
            if untie:  # transformers 5 builds every T5 tied; a Flan-T5 checkpoint stores its own lm_head
                model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape) * 0.2)
                model.config.tie_word_embeddings = False
            made[case] = tmp_path_factory.mktemp(case)
            model.save_pretrained(made[case])
        return made[case]

    return make


def load_theirs(class_name: str, directory):
    """The transformers model of a saved checkpoint, with the eager kernel whose weights parity compares."""
    import transformers

    return getattr(transformers, class_name).from_pretrained(directory, attn_implementation="eager").eval()


def assert_written_back(source, saved, class_name: str) -> None:
    """anatomy's save_pretrained wrote every tensor of the source checkpoint unchanged, for class_name."""
    written, original = load_file(saved / "model.safetensors"), load_file(source / "model.safetensors")
    assert set(written) == set(original)
    for key, tensor in original.items():
        assert torch.equal(written[key], tensor), key
    assert json.loads((saved / "config.json").read_text())["architectures"] == [class_name]
