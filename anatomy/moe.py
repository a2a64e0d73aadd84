"""A sparse mixture of experts: several feed-forward networks, and a router that sends each token
to a few of them (Shazeer et al., 2017; Mixtral, Jiang et al., 2024).

Shape letters: B batch, T positions, E model width, N experts, k experts per token.

    p(x)   = softmax(x W_router)                                   router probabilities [N]
    top    = the k experts of largest p(x)
    g_i(x) = p_i(x) / sum_{j in top} p_j(x)  for i in top, else 0  expert weights, summing to 1
    MoE(x) = sum_{i in top} g_i(x) FFN_i(x)

Each token pays for k experts, not N: the model holds N feed-forward networks' parameters but
computes only k of them per token.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import FeedForward
from .trace import TracePoint


class MixtureOfExperts(nn.Module):
    """router [N, E] (no bias) and experts.0 .. experts.{N-1}, each a FeedForward.

    Trace points: router_logits [batch pos expert] (x W_router), expert_weights [batch pos expert]
    (g(x): nonzero exactly for the chosen experts; an intervention that changes it changes which
    experts run and how much each counts), out [batch pos d_model]. Inside an expert, the points
    see only the tokens routed to it, flattened: [token d_ff].
    """

    def __init__(self, config):
        super().__init__()
        self.top_k = config.n_experts_per_token
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(config) for _ in range(config.n_experts))
        self.router_logits = TracePoint("batch pos expert")
        self.expert_weights = TracePoint("batch pos expert")
        self.out = TracePoint("batch pos d_model")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, E] -> [B, T, E]."""
        logits = self.router_logits(self.router(x))  # (B, T, N)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # (B, T, N), float32 at least
        top_p, top_index = probs.topk(self.top_k, dim=-1)  # (B, T, k)
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)  # renormalised over the chosen k
        weights = self.expert_weights(torch.zeros_like(probs).scatter(-1, top_index, top_p))  # (B, T, N)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            routed = weights[..., i] != 0  # (B, T): the tokens that chose expert i
            if routed.any():
                out[routed] += (weights[..., i][routed, None] * expert(x[routed])).to(x.dtype)  # (tokens, E)
        return self.out(out)
