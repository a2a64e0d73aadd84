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

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    "Check": ".types", "Matrix": ".types", "Step": ".types", "Worked": ".types",
    "Walkthrough": ".walkthrough", "walkthrough": ".walkthrough",
    "EXAMPLES": ".sources", "example_walk": ".examples",
    "render_html": ".render_html", "render_markdown": ".render_markdown",
    "render_terminal": ".render_terminal", "render_text": ".render_terminal",
    "SENTENCE": "anatomy.checkpoints.toys", "TRANSLATION": "anatomy.checkpoints.toys",
    "toy_example": ".examples",
})
