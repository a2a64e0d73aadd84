"""The walkthrough: one real forward pass, narrated in the source texts' order, every number checked.

    from anatomy.walk import walkthrough, toy_example
    walk = walkthrough(*toy_example())          # the default of `anatomy walk`
    walk.print()                                # or walk.to_markdown(), walk.to_html()
    [step.title for step in walk.steps]
    walk.ok                                     # every recomputation matched the model

Each Step has a title, its narration, its equation (plain and LaTeX), the matrices it shows (read
from the trace of the pass; `matrix.point` names the trace point), the lines worked by hand, and
a Check. The files: types (the data), reference (float64 math), narration (the prose), builder and
the step builders by section (input_steps, attention_steps, block_steps, output_steps),
walkthrough (the entry point), render_* (terminal, markdown, html), examples (the sources' numbers).
"""

from ..checkpoints.toys import SENTENCE, TRANSLATION, TOYS, build_toy, toy_tokenizer
from .examples import EXAMPLES, example_walk
from .render_html import render_html
from .render_markdown import render_markdown
from .render_terminal import render_terminal, render_text
from .types import Check, Matrix, Step, Worked
from .walkthrough import Walkthrough, walkthrough


def toy_example(name: str = "toy", **overrides):
    """(model, ids, kwargs) for a trained toy on its own text: `walkthrough(model, ids, **kwargs)`."""
    toy, tokenizer = TOYS[name], toy_tokenizer(name)
    model = build_toy(name, **overrides)
    ids, target = tokenizer.encode_for(model.config, toy.text, toy.target)
    options = {"vocab": lambda i: tokenizer.labels([i])[0], "model_name": name, "task": toy.task}
    if target is not None:
        options.update(target_ids=target, target_tokens=tokenizer.labels(target))
    if toy.arch == "encoder":
        options["mask_token"] = "<MASK>"
    return model, ids, dict(options, tokens=tokenizer.labels(ids))


__all__ = [
    "Check", "Matrix", "Step", "Worked", "Walkthrough", "walkthrough", "toy_example", "EXAMPLES", "example_walk",
    "render_html", "render_markdown", "render_terminal", "render_text", "SENTENCE", "TRANSLATION",
]
