"""The walkthrough: one real forward pass, narrated in the seeds' order, every number checked.

    from anatomy.walk import walkthrough, seed004_example
    walk = walkthrough(*seed004_example())     # the default of `anatomy walk`
    walk.print()                               # or walk.to_markdown(), walk.to_html()
    [step.title for step in walk.steps]
    walk.ok                                    # every step's recomputation matched the model

Each Step has a title, its narration, its equation (plain and LaTeX), the matrices it shows
(read from the trace of the pass; `matrix.point` names the trace point) and a Check.
"""

from .render import render_html, render_markdown, render_terminal, render_text
from .steps import Check, Matrix, Step, Walkthrough, walkthrough
from ..checkpoints.toys import SENTENCE, TRANSLATION, WordVocab, readable_init, seq2seq_vocab, toy_model
from ..checkpoints.toys import article_words as seed004_words, sentence_vocab as seed004_vocab


def seed004_example(text: str = SENTENCE, **overrides):
    """(model, ids, kwargs) for seed 004's sentence on the seeded toy decoder:
    `walkthrough(model, ids, **kwargs)`."""
    vocab = seed004_vocab(text)
    words = seed004_words(text)
    model = toy_model(len(vocab), **overrides)
    return model, vocab.encode(words), {"tokens": words, "vocab": list(vocab.itos), "model_name": "toy"}


__all__ = [
    "Check", "Matrix", "Step", "Walkthrough", "walkthrough", "seed004_example",
    "render_html", "render_markdown", "render_terminal", "render_text",
    "SENTENCE", "TRANSLATION", "WordVocab", "readable_init", "seed004_vocab", "seed004_words", "seq2seq_vocab",
    "toy_model",
]
