"""Which keys of a config.json anatomy reads, and a warning that names every other one.

An architecture's reader (llama.py, bert.py, ...) looks keys up in the config dict; `ReadKeys` records
each key it looks at. A key no reader looked at either is known not to change a forward pass (the
tables below: metadata, generation and training settings, keys another key supersedes) or may change
what transformers computes: a newer option, a misspelling, the other version's spelling of a setting.
anatomy cannot tell which, so it names those keys in an UnknownConfigKeysWarning rather than ignore
them silently.
"""

from __future__ import annotations

import warnings

ANY = None  # in the tables: every value of the key is harmless

# Keys of transformers' PretrainedConfig (4.x and 5.x) and of many config classes that a forward pass in
# eval mode does not read, with the values at which that holds (ANY: all of them).
HARMLESS = {
    # metadata
    "_name_or_path": ANY, "architectures": ANY, "model_type": ANY, "transformers_version": ANY, "dtype": ANY,
    "torch_dtype": ANY, "_commit_hash": ANY, "_attn_implementation_autoset": ANY, "attn_implementation": ANY,
    "tokenizer_class": ANY, "prefix": ANY, "finetuning_task": ANY, "task_specific_params": ANY,
    "problem_type": ANY, "id2label": ANY, "label2id": ANY, "num_labels": ANY, "is_encoder_decoder": ANY,
    "sep_token_id": ANY, "cls_token_id": ANY, "mask_token_id": ANY, "unk_token_id": ANY,
    # how outputs are returned, not what they are
    "output_attentions": ANY, "output_hidden_states": ANY, "return_dict": ANY, "torchscript": ANY,
    "use_return_dict": ANY, "use_cache": ANY, "use_bfloat16": ANY, "tf_legacy_loss": ANY,
    "chunk_size_feed_forward": ANY,  # the same feed-forward, computed in chunks
    # initialisation and training
    "initializer_range": ANY, "init_std": ANY, "initializer_factor": ANY, "gradient_checkpointing": ANY,
    "layerdrop": ANY, "encoder_layerdrop": ANY, "decoder_layerdrop": ANY, "classifier_dropout": ANY,
    "activation_dropout": ANY, "embd_pdrop": ANY, "embed_dropout": ANY, "summary_first_dropout": ANY,
    "qa_dropout": ANY, "seq_classif_dropout": ANY,
    # generation settings (transformers 5 moves them to generation_config.json)
    **dict.fromkeys((
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
        "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
        "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
        "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "max_new_tokens",
        "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff"), ANY),
    # options that change the model only when set
    "pruned_heads": ({}, None), "tie_encoder_decoder": (False, None), "add_cross_attention": (False, None),
    "cross_attention_hidden_size": (None,), "is_decoder": (False, None), "quantization_config": (None,),
}
# model_type -> keys its config classes carry that do not change a forward pass in eval mode
HARMLESS_BY_TYPE = {
    "llama": {"pretraining_tp": ANY},  # transformers 4 splits the projections into that many slices: the same sums
    "mixtral": dict.fromkeys(("router_aux_loss_coef", "output_router_logits", "router_jitter_noise"), ANY),  # training
    "qwen2": {"max_window_layers": ANY},  # superseded by layer_types, which anatomy reads
    "qwen3": {"max_window_layers": ANY},
    "gemma": {"hidden_activation": ANY},  # Gemma (1) classes read hidden_act
    "gemma2": {"hidden_act": ANY, "cache_implementation": ANY, "sliding_window_size": ANY},  # they read hidden_activation
    "gemma3_text": {"hidden_act": ANY, "cache_implementation": ANY, "sliding_window_pattern": ANY,
                    "_sliding_window_pattern": ANY},  # the pattern: superseded by layer_types
    # the double-heads model's classifier; n_ctx, an alias of n_positions; upcasting changes nothing in float32
    "gpt2": {**dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                              "n_ctx"), ANY), "reorder_and_upcast_attn": (False,)},
    "gpt_neox": {"rope_theta": ANY, "partial_rotary_factor": ANY},  # both versions read rotary_emb_base, rotary_pct
    "phi3": {"original_max_position_embeddings": ANY},  # read by "longrope" scaling only, which anatomy refuses
    # num_hidden_layers: the alias of the layer count transformers 4 writes beside it
    "gpt_neo": {"num_hidden_layers": ANY},
    "bart": {"num_hidden_layers": ANY},
    "marian": {"num_hidden_layers": ANY},
    "t5": {"num_hidden_layers": ANY, "dense_act_fn": ANY, "is_gated_act": ANY},  # derived from feed_forward_proj
}


class UnknownConfigKeysWarning(UserWarning):
    """A config.json holds keys that anatomy neither reads nor knows to be harmless."""


class ReadKeys(dict):
    """A config dict that records every key looked up in it (get, [], in) in `read`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def unknown_keys(hf: ReadKeys, model_type: str) -> dict:
    """The keys of `hf` (and their values) that no reader looked at and no table calls harmless."""
    tables = (HARMLESS, HARMLESS_BY_TYPE.get(model_type, {}))
    unknown = {}
    for key, value in hf.items():
        allowed = [table[key] for table in tables if key in table]
        if key in hf.read or any(values is ANY or value in values for values in allowed):
            continue
        unknown[key] = value
    return unknown


def warn_unknown_keys(hf: ReadKeys, model_type: str, source: str) -> list[str]:
    """UnknownConfigKeysWarning naming the keys of unknown_keys, when there are any; returns those keys."""
    unknown = unknown_keys(hf, model_type)
    if unknown:
        warnings.warn(f"the config of {source} has keys anatomy does not read: {_shown(unknown)}. They may change "
                      "what transformers computes; anatomy's model ignores them, and save_pretrained leaves them out",
                      UnknownConfigKeysWarning, stacklevel=3)
    return sorted(unknown)


def leave_out_unknown_keys(hf: dict, unknown: list[str]) -> dict:
    """`hf` (a config read from a checkpoint) without the keys its reading did not understand, with a
    warning naming them: written back, they could make transformers compute other than the model saved."""
    left_out = {key: hf[key] for key in unknown if key in hf}
    if left_out:
        warnings.warn("save_pretrained: config.json leaves out the keys anatomy did not read when it loaded this model: "
                      f"{_shown(left_out)}", UnknownConfigKeysWarning, stacklevel=4)
    return {key: value for key, value in hf.items() if key not in left_out}


def _shown(keys: dict) -> str:
    return ", ".join(f"{key}={value!r}"[:80] for key, value in sorted(keys.items()))
