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

from .attribution import attention_rollout, gradient_x_input, integrated_gradients
from .decompose import decompose, direct_logit_attribution
from .heads import detect_heads
from .inputs import as_batch, run_with_cache
from .lens import logit_lens
from .patching import patch
from .result import Result
from .weights import process_weights

__all__ = [
    "Result", "as_batch", "attention_rollout", "decompose", "detect_heads", "direct_logit_attribution",
    "gradient_x_input", "integrated_gradients", "logit_lens", "patch", "process_weights", "run_with_cache",
]
