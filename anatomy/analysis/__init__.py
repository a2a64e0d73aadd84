"""Analyses that prove themselves: each returns named axes and states the identity it checked.

    logits, cache = anatomy.run_with_cache(model, "The cat sat on the")
    anatomy.logit_lens(model, text)                    # [layer+1, batch, pos, vocab]
    anatomy.decompose(model, text)                     # [component, batch, pos, d_model]
    anatomy.direct_logit_attribution(model, text, id)  # [component, batch, pos]
    anatomy.patch(model, clean, corrupt, point="resid_pre", metric=fn)  # [layer, pos]
    anatomy.integrated_gradients(model, text, target)  # [batch, pos]
    anatomy.attention_rollout(model, text)             # [layer, batch, query, key]
    anatomy.detect_heads(model, "induction")           # [layer, head]
    anatomy.process_weights(model)                     # the same function, simpler weights
"""

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    "attention_rollout": ".attribution", "gradient_x_input": ".attribution", "integrated_gradients": ".attribution",
    "decompose": ".decompose", "direct_logit_attribution": ".decompose",
    "detect_heads": ".heads",
    "as_batch": ".inputs", "run_with_cache": ".inputs",
    "logit_lens": ".lens",
    "patch": ".patching",
    "Result": ".result",
    "process_weights": ".weights",
})
