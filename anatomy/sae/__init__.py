"""Features: sparse autoencoders and transcoders, loaded, attached to a pass, trained and shown.

    sae = anatomy.load_sae("path/to/folder")            # SAELens's cfg.json + sae_weights.safetensors, or params.npz
    with anatomy.trace(model, ["blocks.6.resid_post.sae.features"], saes={"blocks.6.resid_post": sae}) as t:
        model(ids)                                       # outputs unchanged: x = reconstruction + error
    t["blocks.6.resid_post.sae.features"]                # [batch, pos, feature]
"""

from .formats import load_sae, save_sae
from .modules import KINDS, SAE

__all__ = ["KINDS", "SAE", "load_sae", "save_sae"]
