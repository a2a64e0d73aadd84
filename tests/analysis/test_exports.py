"""The analyses are part of anatomy's public surface and offered by tab completion."""

import anatomy

PUBLIC = ["run_with_cache", "logit_lens", "decompose", "direct_logit_attribution", "patch", "integrated_gradients",
          "gradient_x_input", "attention_rollout", "detect_heads", "process_weights", "generate", "from_pretrained",
          "head_view", "trace"]


def test_public_names_resolve_and_are_listed_by_dir():
    listed = dir(anatomy)
    for name in PUBLIC:
        assert name in listed, name
        assert callable(getattr(anatomy, name)), name
