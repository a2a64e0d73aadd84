"""Why a head attends where it does: its attention score at one (query, key) position pair, split into pairs of
nodes (Kamath et al. 2025, "Tracing Attention Computation Through Feature Interactions").

Shape letters: T positions, E d_model, H query heads, K key/value heads, D d_head, N nodes, n the nodes that
reach one side.

Head h of layer l scores key position q for query position p as

    score = c  q_p . k_q,     q_p = Rot_p QN(W_Q^h norm(x_p) + b_Q^h),     k_q = Rot_q KN(W_K^g norm(x_q) + b_K^g)

x = resid_pre(l); norm: the sublayer's norm, its scale frozen (replacement.py); QN, KN: the q/k norms (Qwen3,
OLMo 2, Gemma 3), their scales frozen at this prompt's likewise; Rot_p: the rotary rotation at position p (each
side at its own, the model's positional.RotaryEmbedding); g = h // (H / K), the query head's own key/value head
(grouped-query attention); c: the score's scale (1/sqrt(D), or query_pre_attn_scalar's). With the scales frozen
both sides are affine in the stream, and the stream is the sum of what the nodes write (stream.py), so

    q_p = sum_s Q_s + Q_0     Q_s = Rot_p QN W_Q^h norm(M_{l,p <- s} w_s)   (the linear parts: one per node s)
    k_q = sum_t K_t + K_0     Q_0, K_0: what no node carries (biases, b_Q, b_K, positions, the first position)

    score = sum_{s,t} c Q_s . K_t                               the pair terms (query-side node, key-side node)
          + sum_s c Q_s . K_0 + sum_t c Q_0 . K_t + c Q_0 . K_0    the terms with no node on one side, or both

Marginals: each side's node against the whole other side, c Q_s . k_q (query side) and c q_p . K_t (key side).
The score the identity is checked against is the model's own, c q . k from its trace points q_rot and k_rot. A
Gemma 2 score is soft-capped after this, cap tanh(score / cap) (the cap keeps the scores' order): the
decomposition is of the score before the cap, and says so; an ALiBi bias is added after, a term of no node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..layers import norm_parts
from ..positional import alibi_bias
from ..trace import trace
from .graph import Node
from .stream import NodeStream

PAIR_COLUMNS = 256  # key-side nodes taken at once when searching for the strongest pair terms


@dataclass
class QKAttribution:
    """One head's score at (query, key), split (module docstring). pairs: [(query node, key node, term)], the
    strongest by |term|; query_marginals, key_marginals: [(node, marginal)], the strongest; no_node: the terms with
    no node on the key side ("query nodes x rest"), the query side ("rest x key nodes") or either ("rest x rest");
    score: the model's score before any cap; capped: after Gemma 2's soft-cap (None without one); bias: ALiBi's
    (0.0 without); pattern: the head's attention weight at (query, key); pair_total: the sum of every pair term;
    check/error: the identity score = pair_total + no_node terms, its difference as a share of the terms' sizes
    (c times the sum of the query side's vector lengths times |k|: the most its marginals can add up to);
    position_pairs [(query-side position, key-side position, term)]: the pair terms summed over the nodes at each
    position, the strongest; query_positions, key_positions [(position, marginal)]: the marginals so summed."""

    layer: int
    head: int
    kv_head: int
    query: int
    key: int
    score: float
    pattern: float
    pairs: list[tuple[Node, Node, float]]
    query_marginals: list[tuple[Node, float]]
    key_marginals: list[tuple[Node, float]]
    no_node: dict[str, float]
    pair_total: float
    check: str
    error: float
    capped: float | None = None
    bias: float = 0.0
    notes: list[str] = field(default_factory=list)
    position_pairs: list[tuple[int, int, float]] = field(default_factory=list)
    query_positions: list[tuple[int, float]] = field(default_factory=list)
    key_positions: list[tuple[int, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"L{self.layer} H{self.head} @{self.query}->{self.key}"


class HeadScores:
    """What one traced pass of the model gives every head of `layers`: the rotated queries and keys [H or K, T, D]
    (the score the identity checks against), and the q/k norms' inputs (their scales, frozen)."""

    def __init__(self, stream: NodeStream, layers: list[int]):
        model = stream.rep.model
        self.stream, self.model = stream, model
        rotary = model.config.pos_encoding == "rotary"
        names = [f"blocks.{l}.attn.{point}" for l in layers
                 for point in (("q_rot", "k_rot") if rotary else ("q", "k"))]
        self.norm_inputs: dict = {}
        handles = []
        for l in layers:
            attn = model.blocks[l].attn
            for which in ("q_norm", "k_norm"):
                if hasattr(attn, which):
                    handles.append(getattr(attn, which).register_forward_pre_hook(
                        lambda module, args, key=(l, which): self.norm_inputs.__setitem__(key, args[0].detach())))
        try:
            with torch.no_grad(), trace(model, names) as t:
                model(stream.rep.ids[None])
        finally:
            for handle in handles:
                handle.remove()
        self.q = {l: t[f"blocks.{l}.attn.{'q_rot' if rotary else 'q'}"][0].double() for l in layers}  # (H, T, D)
        self.k = {l: t[f"blocks.{l}.attn.{'k_rot' if rotary else 'k'}"][0].double() for l in layers}  # (K, T, D)

    def side(self, layer: int, which: str, head: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(M [D, E], m [D]): one head's rotated query (which="q", head a query head) or key ("k", a key/value
        head) at `position` as M x + m of resid_pre(layer)[position] = x, with the sublayer's norm and the q/k norm
        frozen; m includes every bias. The linear map is Rot diag(sigma gamma_qk) W diag(s gamma) C (C: a
        LayerNorm's centring)."""
        attn = self.model.blocks[layer].attn
        norm = self.stream.rep.sublayers[layer].norm
        D = attn.d_head
        projection = attn.q_proj if which == "q" else attn.k_proj
        rows = slice(head * D, (head + 1) * D)
        W = projection.weight.detach().float()[rows]  # (D, E)
        b = torch.zeros(D, device=W.device) if projection.bias is None else projection.bias.detach().float()[rows]
        M = W * (norm.scale[position] * norm.gain)  # (D, E): W diag(s gamma)
        if norm.centred:
            M = M - M.mean(dim=1, keepdim=True)  # ... C, the centring (symmetric)
        beta = torch.zeros(W.size(1), device=W.device) if norm.bias is None else norm.bias
        no_node = self.stream.no_node_stream(layer)[position]  # (E,)
        centred = no_node - no_node.mean() if norm.centred else no_node
        pre = W @ (centred * norm.scale[position] * norm.gain + beta) + b  # (D,): the no-node stream's projection
        gain = self.qk_norm_gain(layer, which, head, position)  # (D,)
        rotation = self.rotation(layer, position)  # (D, D)
        return rotation @ (gain[:, None] * M), rotation @ (gain * pre)

    def qk_norm_gain(self, layer: int, which: str, head: int, position: int) -> torch.Tensor:
        """[D]: sigma gamma of the q/k norm for one head at one position (its frozen scale times its gain; ones
        without a q/k norm)."""
        attn = self.model.blocks[layer].attn
        D = attn.d_head
        key = (layer, f"{which}_norm")
        if key not in self.norm_inputs:
            return torch.ones(D, device=self.stream.rep.device)
        parts = norm_parts(getattr(attn, f"{which}_norm"), self.norm_inputs[key])
        if attn.qk_norm == "per_head":  # input (1, heads, T, D): a scale per head and position
            return float(parts.scale[0, head, position]) * parts.gain.float()
        return float(parts.scale[0, position]) * parts.gain.float()[head * D:(head + 1) * D]  # (1, T, heads*D)

    def rotation(self, layer: int, position: int) -> torch.Tensor:
        """[D, D]: the layer's rotary rotation at `position` (the identity without rotary), from the model's own
        RotaryEmbedding applied to the basis vectors."""
        attn = self.model.blocks[layer].attn
        D = attn.d_head
        if attn.rotary is None:
            return torch.eye(D, device=self.stream.rep.device)
        device = attn.rotary.cos.device
        basis = torch.eye(D, dtype=attn.rotary.cos.dtype, device=device)[None, :, None, :]  # (1, D as heads, 1 position, D)
        rotated = attn.rotary(basis, torch.tensor([position], device=device))  # (1, D, 1, D): row j is Rot e_j
        return rotated[0, :, 0, :].T.float()


def score_scale(attn) -> float:
    """c: the factor on q . k (1/sqrt(D), or query_pre_attn_scalar's)."""
    return 1.0 / math.sqrt(attn.d_head) if attn.scale is None else float(attn.scale)


def qk_attribution(model, transcoders, prompt, layer: int, head: int, query: int, key: int,
                   top: int = 10) -> QKAttribution:
    """Why head `head` of layer `layer` attends from position `query` to position `key` on `prompt` (a text or ids,
    as attribution_graph reads it: a BOS in front), split into pairs of nodes of the prompt's attribution graph
    (module docstring). Raises ValueError as qk_attributions and attribute.prompt_ids do."""
    return qk_attributions(NodeStream(model, transcoders, prompt), [(layer, head, query, key)], top)[0]


@torch.no_grad()
def qk_attributions(stream: NodeStream, heads: list[tuple[int, int, int, int]], top: int = 10) -> list[QKAttribution]:
    """One QKAttribution for each (layer, head, query position, key position) of `heads`, every side's rows carried
    back in one sweep (stream.read_back). Raises ValueError for a head, a layer or positions out of range, or a
    key after its query."""
    model, T = stream.rep.model, len(stream.rep.ids)
    config = model.config
    for layer, head, query, key in heads:
        if not (0 <= layer < config.n_layers and 0 <= head < config.n_heads):
            raise ValueError(f"no head L{layer} H{head}: layers 0 .. {config.n_layers - 1}, heads 0 .. {config.n_heads - 1}")
        if not 0 <= key <= query < T:
            raise ValueError(f"positions must satisfy 0 <= key <= query < {T} (the prompt's length); got query "
                             f"{query}, key {key}")
    scores = HeadScores(stream, sorted({layer for layer, *_ in heads}))
    group = config.n_heads // config.n_kv_heads
    sides: dict = {}  # (layer, "q"|"k", head, position) -> (M, m): each side once
    for layer, head, query, key in heads:
        for side in ((layer, "q", head, query), (layer, "k", head // group, key)):
            if side not in sides:
                sides[side] = scores.side(*side)
    order = list(sides)
    read = stream.read_back([(side[0], side[3], sides[side][0]) for side in order])  # (layer, position, rows M)
    made = {side: node_side(stream, terms, sides[side][1]) for side, terms in zip(order, read)}
    return [attribution(stream, scores, made, layer, head, query, key, top) for layer, head, query, key in heads]


class Side(NamedTuple):
    """One side of a head at one position (its rotated query, or key) as its nodes' shares: nodes [n] (the columns
    that reach it), vectors [n, D] (float64), lengths [n] (their norms), at [T, D] (summed by the nodes'
    positions), rest [D] (what no node carries: Q_0 or K_0), total [D] (all of it, q or k)."""

    nodes: torch.Tensor
    vectors: torch.Tensor
    lengths: torch.Tensor
    at: torch.Tensor
    rest: torch.Tensor
    total: torch.Tensor


def node_side(stream: NodeStream, terms: torch.Tensor, rest: torch.Tensor) -> Side:
    """The Side of terms [D, W] (each node's share of each coordinate, read_back's) and rest [D]."""
    nodes = (terms != 0).any(0).nonzero().flatten()
    vectors = terms[:, nodes].T.double()  # (n, D): the nodes that reach this side, in float64 from here
    T = len(stream.rep.ids)
    one_hot = torch.zeros(T, len(nodes), dtype=torch.float64, device=terms.device)
    one_hot[stream.positions[nodes], torch.arange(len(nodes), device=terms.device)] = 1.0  # (T, n): each node's position
    return Side(nodes, vectors, vectors.norm(dim=1), one_hot @ vectors, rest.double(), vectors.sum(0) + rest.double())


def attribution(stream: NodeStream, scores: HeadScores, sides: dict, layer: int, head: int, query: int, key: int,
                top: int) -> QKAttribution:
    """The QKAttribution of one head and position pair from its two Sides (qk_attributions)."""
    attn = stream.rep.model.blocks[layer].attn
    c = score_scale(attn)
    kv = head // (attn.n_heads // attn.n_kv_heads)
    q, k = sides[(layer, "q", head, query)], sides[(layer, "k", kv, key)]
    q_nodes_sum, k_nodes_sum = q.total - q.rest, k.total - k.rest  # (D,): sum_s Q_s, sum_t K_t
    pair_total = c * float(q_nodes_sum @ k_nodes_sum)
    no_node = {"query nodes x rest": c * float(q_nodes_sum @ k.rest), "rest x key nodes": c * float(q.rest @ k_nodes_sum),
               "rest x rest": c * float(q.rest @ k.rest)}
    model_score = c * float(scores.q[layer][head, query] @ scores.k[layer][kv, key])
    difference = model_score - pair_total - sum(no_node.values())
    # the terms' sizes: c (sum_s |Q_s| + |Q_0|) |k|, a bound on the query side's marginals added up
    sizes = c * float(q.lengths.sum() + q.rest.norm()) * float(k.total.norm())
    error = abs(difference) / max(sizes, 1e-30)
    node = stream.nodes
    pairs = [(node[int(q.nodes[i])], node[int(k.nodes[j])], c * value)
             for i, j, value in strongest_pairs(q.vectors, k.vectors, top, q.lengths, k.lengths)]
    capped, bias, notes = None, 0.0, []
    if attn.softcap is not None:
        capped = attn.softcap * math.tanh(model_score / attn.softcap)
        notes.append(f"the score is soft-capped after this, {attn.softcap:g} tanh(score / {attn.softcap:g}) = "
                     f"{capped:.6g}: the terms split the score before the cap")
    if getattr(stream.rep.model, "alibi_slopes", None) is not None:
        slopes = stream.rep.model.alibi_slopes
        bias = float(alibi_bias(slopes, torch.tensor([query], device=slopes.device), torch.tensor([key], device=slopes.device))[head, 0, 0])
        notes.append(f"ALiBi adds {bias:.6g} after it, a term of no node")
    check = (f"score {model_score:.6g} (the model's, before any cap) = the pair terms {pair_total:.6g} + the terms with "
             f"no node {sum(no_node.values()):.6g}: difference {abs(difference):.2g}, {error:.2g} of the terms' sizes")
    marginals = (strongest(node, q.nodes, c * (q.vectors @ k.total), top),  # each query-side node against all of k
                 strongest(node, k.nodes, c * (k.vectors @ q.total), top))
    return QKAttribution(
        layer, head, kv, query, key, model_score, float(stream.rep.sublayers[layer].attention.pattern[head, query, key]),
        pairs, *marginals, no_node, pair_total, check, error, capped, bias, notes, *by_position(q, k, c, top))


def by_position(q: Side, k: Side, c: float, top: int) -> tuple[list, list, list]:
    """(position pairs, query positions, key positions): the pair terms and the marginals summed over the nodes at each
    position, c (sum_{s at a} Q_s) . (sum_{t at b} K_t) and c (sum_{s at a} Q_s) . k (and the reverse)."""
    T = q.at.size(0)
    pairs = (c * q.at @ k.at.T).flatten()  # (T T): query-side position, key-side position
    chosen = pairs.abs().topk(min(top, pairs.numel())).indices
    position_pairs = [(int(i) // T, int(i) % T, float(pairs[i])) for i in chosen if pairs[i] != 0]
    sides = []
    for at, other in ((q.at, k.total), (k.at, q.total)):
        marginals = c * at @ other  # (T,)
        sides.append([(int(p), float(marginals[p])) for p in marginals.abs().argsort(descending=True) if at[p].any()])
    return position_pairs, sides[0], sides[1]


def strongest(nodes: list[Node], columns: torch.Tensor, values: torch.Tensor, n: int) -> list[tuple[Node, float]]:
    """(node, value) of the n largest |values| (values [n'] for the nodes at columns [n'])."""
    chosen = values.abs().topk(min(n, len(values))).indices
    return [(nodes[int(columns[i])], float(values[i])) for i in chosen]


def strongest_pairs(Q: torch.Tensor, K: torch.Tensor, n: int, q_size: torch.Tensor | None = None,
                    k_size: torch.Tensor | None = None) -> list[tuple[int, int, float]]:
    """(i, j, Q_i . K_j) of the n largest |Q_i . K_j| (Q [a, D], K [b, D]), largest first, exactly, without every
    product when the sizes allow: |Q_i . K_j| <= |Q_i| |K_j| (Cauchy-Schwarz), so the columns are taken by size, a
    block at a time, each against the rows that could still beat the n-th largest so far (tau), until no column
    left can: max |Q| |K_j| < tau. q_size, k_size: the rows' norms, if known."""
    if len(Q) == 0 or len(K) == 0 or n <= 0:
        return []
    q_size = Q.norm(dim=1) if q_size is None else q_size
    k_size = K.norm(dim=1) if k_size is None else k_size
    order = k_size.argsort(descending=True)
    values, at = torch.zeros(0, dtype=Q.dtype, device=Q.device), torch.zeros(0, 2, dtype=torch.long, device=Q.device)
    # a first tau from the largest rows against the largest columns: a lower bound on the n-th largest
    first = (Q[q_size.topk(min(len(Q), max(n, 64))).indices] @ K[order[:PAIR_COLUMNS]].T).abs().flatten()
    tau = float(first.topk(n).values[-1]) if first.numel() >= n else 0.0
    for start in range(0, len(order), PAIR_COLUMNS):
        columns = order[start:start + PAIR_COLUMNS]
        largest = float(k_size[columns[0]])
        if float(q_size.max()) * largest < tau:
            break  # no column left can reach the n-th largest
        rows = (q_size * largest >= tau).nonzero().flatten()
        block = (Q[rows] @ K[columns].T).flatten()  # (r c,)
        kept = block.abs().topk(min(n, block.numel())).indices
        found = torch.stack([rows[kept // len(columns)], columns[kept % len(columns)]], dim=1)
        values, at = torch.cat([values, block[kept]]), torch.cat([at, found])
        best = values.abs().topk(min(n, len(values))).indices
        values, at = values[best], at[best]
        if len(values) >= n:
            tau = max(tau, float(values.abs().min()))
    return [(int(i), int(j), float(v)) for (i, j), v in zip(at.tolist(), values.tolist())]
