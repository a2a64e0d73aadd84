"""The walkthrough's prose, as data: one entry per idea, formatted with the step's numbers.

Kept apart from the code that computes, so that the words can be read, reviewed and changed in
one place. Sources are cited by title and author.
"""

from __future__ import annotations

ARMAS = 'Alejandro Armas, "What are Transformers – Understanding the Architecture End-to-End" (2024)'
ANASASHB = 'anasashb, "Transformers: Walking Through the Encoder Forward Pass"'
ANATOMY_NOTES = 'the "3 Transformer Anatomy" notes'

TEXT = {
    "tokens": "The text is split into {T} tokens and each is replaced by its index in a vocabulary of "
              "{V} entries. The model sees only these integers.",
    "one_hot": "Each id becomes a row of {V} zeros with a single 1 at the token's index: the rows are "
               "orthogonal, and they carry no notion of similarity yet.",
    "lookup": "Multiplying a one-hot row by the embedding matrix W_E ({V}×{E}) selects one of its rows: "
              "the embedding layer is a lookup table, one learned vector per token.",
    "token_types": "BERT adds a third vector saying which segment (sentence A or B) a token belongs to; "
                   "a single sentence is all segment 0.",
    "input_sum": "The input of the first layer is the sum: meaning (E) plus position (P).",
    "input_no_p": "The input of the first layer is E itself: this model puts its position information "
                  "inside attention instead (see the positional-encoding step).",
    "embed_norm": " BERT then normalises each row (a LayerNorm right after the embeddings).",
    "sinusoidal": "Attention by itself is blind to order, so a fixed vector of sinusoids, one per position, "
                  "is added to each embedding (Vaswani et al. 2017, §3.5): {layout}, i = 0 … {last}. "
                  "The frequency is indexed by the pair i, as in the paper; " + ARMAS + " writes the "
                  "exponent with the dimension index instead (see `anatomy walk --example armas`).",
    "learned": "This model learned one vector per position (BERT, GPT-2): rows 0 … T−1 of a trained "
               "table of {n} positions are added to the embeddings.",
    "rotary": "This model adds no position vector to the embeddings: it uses rotary positions (RoPE, "
              "Llama). Inside every attention layer each pair of query and key dimensions is rotated "
              "by an angle proportional to the position, so that q_m · k_n depends on m − n only. "
              "See the rotation step in the layer below.",
    "alibi": "This model adds no position vector: it uses ALiBi. Each head adds −m_h·|i − j| to the "
             "score of query i and key j, a penalty growing with distance (see the scaling step).",
    "no_positions": "This model uses no position information at all (pos_encoding='none'): it cannot tell "
                    "'dog bites man' from 'man bites dog' except through a causal mask.",
    "qkv": "Three learned projections map each row of the input into a query (what am I looking "
           "for?), a key (what do I contain?) and a value (what do I pass on?). Head {h} of "
           "{H} uses its own {D}-column slice of each matrix (d_k = {D}).",
    "qkv_cross": "Cross-attention: the queries come from the decoder (what each target position is "
                 "looking for), the keys and values from the encoder output M (what each source "
                 "token offers). Head {h} of {H} uses its own {D}-column slice of each matrix.",
    "gqa": " Key/value head {g} serves a group of {group} query heads (grouped-query attention), so "
           "K and V have {K} heads where Q has {H}.",
    "qk_norm": " The queries and keys then go through an RMSNorm ({how}) before the scores.",
    "rotation": "Each pair of dimensions of a query or key at position m is rotated by the angle m·ω_j "
                "(θ = {theta:g}). Values are not rotated.",
    "dot": "Every query is compared with every key by a dot product: large when they point the same "
           "way. The result is {shape}.",
    "scale": "Dividing by √d_k = √{D} = {root:.4f} keeps the scores' variance near 1 whatever the "
             "head width, so the softmax does not saturate into a one-hot row.",
    "scale_custom": "This model divides by √{scalar:g} (its query_pre_attn_scalar) rather than by √d_k.",
    "softcap": " The scores are then soft-capped: c·tanh(s/c) with c = {cap:g}, bounded to (−c, c).",
    "alibi_bias": " ALiBi then adds a bias −m_h·|i − j|: distant keys are penalised.",
    "relative_bias": " T5 then adds a learned bias b_h for the bucket of the distance j − i (one bucket per "
                     "distance up close, log-spaced ones farther away): one table per stack, shared by its layers.",
    "no_mask": "No mask: every token may attend to every token, before and after it (bidirectional "
               "attention, an encoder).",
    "no_mask_cross": "No mask: every target position may attend to every source token (there is no "
                     "padding in a single sentence).",
    "causal": "The causal mask: token i may attend only to tokens j ≤ i, never to the future it must "
              "predict. Blocked scores become −∞, so that exp(−∞) = 0 after the softmax. (The model "
              "writes the most negative float32, −3.4e38, rather than −∞: it cannot overflow, and "
              "exp sends both to 0.)",
    "window": " This layer also slides a window: query i sees only the last {w} keys, i − {w} < j ≤ i.",
    "softmax": "Each row is turned into a probability distribution over the keys: exponentiate, then "
               "divide by the row's sum.",
    "av": "Each output row is a mixture of the value rows, weighted by that row of A: the token's new, "
          "contextualised representation (in this head's subspace).",
    "concat": "All {H} heads ran the same steps in parallel, each on its own slice. Their outputs are "
              "placed side by side ({H}×{D} = {HD} columns) and mixed by one more learned matrix W_O.",
    "masked_self": "The decoder first attends to its own tokens, exactly as in the steps above but with "
                   "the causal mask: each target position sees only the positions before it. Shown: the "
                   "pattern of head {h} and the output of all heads after W_O.",
    "pre_norm": "Pre-norm (GPT-2, Llama): each sublayer reads a normalised copy of the residual stream, "
                "which itself is never normalised inside the block.",
    "out_norm": "This model also normalises the sublayer's output before adding it to the stream "
                "({how}).",
    "residual": "The sublayer's output is added to the stream it read from: the residual path lets every "
                "layer refine the representation instead of replacing it.",
    "parallel": "A parallel block (GPT-NeoX, GPT-J): attention and the feed-forward network both read "
                "the same normalised input, and both outputs are added to the stream at once.",
    "post_norm": "Post-norm (Vaswani et al. 2017, BERT, and " + ANASASHB + "): add the sublayer's output "
                 "to its input, then normalise each row to mean 0 and variance 1 and rescale it: {rule}, "
                 "ε = {eps:g}.",
    "ffn": "The same two-layer network is applied to every position on its own: widen from d_model = "
           "{E} to d_ff = {F}, apply the non-linearity {act}, and project back to {E}. Attention mixed "
           "information between tokens; this step processes each token's mixture.",
    "ffn_gated": "The same gated network is applied to every position on its own: two projections widen it "
                 "from d_model = {E} to d_ff = {F}, a gate passed through {act} and an up projection, which "
                 "are multiplied element by element (the gate decides how much of each up unit passes), and "
                 "W_down projects back to {E}. Attention mixed information between tokens; this step "
                 "processes each token's mixture.",
    "moe": "A mixture of experts: a router scores {n} feed-forward networks for each token, and the "
           "token's output is the weighted sum of the {k} experts it picks.",
    "later_layers": "Each further layer repeats the same steps with its own weights, reading the previous "
                    "layer's output. After layer {last}:",
    "earlier_layers": "The layers before layer {layer} run the same steps with their own weights; their "
                      "output is layer {layer}'s input.",
    "final_norm": "A pre-norm stack leaves its residual stream un-normalised, so one last norm follows "
                  "the final layer.",
    "memory": "The last encoder layer's output is the memory: every decoder layer's cross-attention reads "
              "its keys and values from it. It is computed once per source sentence.",
    "logits": "Each position's final vector is scored against every token of the vocabulary",
    "tied": ": the output layer reuses the embedding matrix, transposed (tied weights, the paper §3.4).",
    "next_token": "A softmax over the vocabulary turns each row of logits into the model's distribution "
                  "for the next token; row t predicts token t + 1.",
    "masked_token": "A softmax over the vocabulary turns each row of logits into the model's guess for the "
                    "word at that position; the guess that matters is the one at {mask}.",
    "unmasked": "A masked-language model: each row is its guess for the word at that position, given the "
                "whole text on both sides. This text has no {mask}, so each row guesses the word already "
                "there; put {mask} where a word should be guessed.",
    "untrained": " The weights are untrained, so these probabilities illustrate the computation, not language.",
    "pooled_none": "One vector for the whole sentence: this model has no pooler, so the rows are averaged "
                   "(mean pooling, as sentence-transformers do for MiniLM). Two sentences are then "
                   "compared by the cosine of their vectors.",
}


def say(key: str, **fields) -> str:
    """The prose for `key`, with the step's numbers filled in."""
    return TEXT[key].format(**fields)
