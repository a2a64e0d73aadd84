"""A checkpoint's own chat template, rendered the way transformers' `apply_chat_template` renders it.

An instruction-tuned model learned its conversations in one written format, and answers well only
when it sees that format again. SmolLM2-Instruct's, for example:

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    What is the capital of France?<|im_end|>
    <|im_start|>assistant
                                         <- the model writes its answer here, then <|im_end|>

The checkpoint ships that format as a Jinja template (tokenizer_config.json's "chat_template",
chat_template.jinja, or a GGUF file's tokenizer.chat_template). It is rendered in jinja2's
ImmutableSandboxedEnvironment, as transformers does, so a template can neither reach Python's
internals nor change the messages; with the variables transformers passes (messages,
add_generation_prompt, bos_token, eos_token) and its helper raise_exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

from ..text import check_text

ROLES = ("system", "user", "assistant", "tool")

# A template is a checkpoint's file, so it may be hostile. The longest in use (tool calling, thinking
# modes) are about 15,000 characters; jinja compiles one of 20 MB in minutes and gigabytes. Rendering
# is bounded by jinja's sandbox hooks: every loop over range() counts against one budget per render
# (nested range(100000) loops would run 10**10 times), and `*` and `**` may not build a value past
# MAX_RENDERED ("x" * 10**10 would take 10 GB).
MAX_TEMPLATE_CHARACTERS = 200_000
RANGE_BUDGET = 1_000_000  # iterations of range() per render
MAX_RENDERED = 10_000_000  # characters (or items) a `*` may produce; digits of a `**`


class ChatError(ValueError):
    """The messages are malformed, or the checkpoint has no usable chat template."""


def check_messages(messages) -> list[dict[str, str]]:
    """A list of {"role": one of ROLES, "content": str}; ChatError naming the first bad one."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ChatError('messages must be a non-empty list of {"role": ..., "content": ...} dicts, e.g. '
                        '[{"role": "user", "content": "Hello"}]')
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            raise ChatError(f"messages[{i}] must be a dict with a string 'content', got {type(message).__name__}")
        if message.get("role") not in ROLES:
            raise ChatError(f"messages[{i}] has role {message.get('role')!r}; roles are {', '.join(ROLES)}")
        content = check_text(message["content"], f"messages[{i}]['content']", empty=True)
        checked.append({"role": message["role"], "content": content})
    return checked


def _raise_exception(message: str):
    raise ChatError(f"the chat template refused the messages: {message}")


class _Budget:
    """range() for one render: the sandbox's own (at most 100,000 items each), and all of them
    together at most RANGE_BUDGET items."""

    def __init__(self, safe_range):
        self.left, self.safe_range = RANGE_BUDGET, safe_range

    def range(self, *args):
        numbers = self.safe_range(*args)
        self.left -= len(numbers)
        if self.left < 0:
            raise ChatError(f"the chat template loops more than {RANGE_BUDGET:,} times: it is refused")
        return numbers


def _bounded_binop(operator: str, left, right):
    """`left operator right` for the intercepted `*` and `**`, refused when its result would be huge."""
    if operator == "*":
        count, sized = (right, left) if isinstance(right, int) else (left, right)
        if isinstance(count, int) and hasattr(sized, "__len__") and len(sized) * count > MAX_RENDERED:
            raise ChatError(f"the chat template builds a value of {len(sized) * count:,} items: it is refused")
        return left * right
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
            and right * math.log10(abs(left)) > MAX_RENDERED:
        raise ChatError("the chat template computes a number too large to write: it is refused")
    return left**right


@lru_cache(maxsize=8)
def _compiled(template: str):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            return _bounded_binop(operator, left, right)

    if len(template) > MAX_TEMPLATE_CHARACTERS:
        raise ChatError(f"the checkpoint's chat template has {len(template):,} characters; anatomy renders at most "
                        f"{MAX_TEMPLATE_CHARACTERS:,} (the longest in use have about 15,000)")
    environment = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    environment.globals["raise_exception"] = _raise_exception
    try:
        return environment.from_string(template)
    except TemplateError as error:
        raise ChatError(f"the checkpoint's chat template does not parse: {error}") from None


def render_chat(template: str | None, messages, *, add_generation_prompt: bool = True,
                bos_token: str | None = None, eos_token: str | None = None) -> str:
    """The conversation as the text the model was trained on. add_generation_prompt ends it with the
    assistant's header, so that what the model writes next is its answer.

    Raises ChatError for malformed messages, a missing template, or one that fails to render."""
    from jinja2 import TemplateError
    from jinja2.exceptions import SecurityError

    if not template:
        raise ChatError("this checkpoint has no chat template (tokenizer_config.json's chat_template, "
                        "chat_template.jinja or GGUF tokenizer.chat_template): it was not tuned for chat")
    from jinja2.sandbox import safe_range

    checked = check_messages(messages)
    try:
        return _compiled(template).render(messages=checked, add_generation_prompt=add_generation_prompt,
                                          bos_token=bos_token or "", eos_token=eos_token or "", tools=None,
                                          documents=None, range=_Budget(safe_range).range)
    except (TemplateError, SecurityError, OverflowError, MemoryError) as error:
        why = "it needs more memory than there is" if isinstance(error, MemoryError) else str(error)
        raise ChatError(f"the checkpoint's chat template failed: {why}") from None


def turn_end(template: str | None, bos_token: str | None = None, eos_token: str | None = None) -> str | None:
    """The text the template writes right after an assistant's answer (SmolLM2's "<|im_end|>",
    Llama 3's "<|eot_id|>", Gemma's "<end_of_turn>"): where a generated answer stops. Found by
    rendering a conversation whose answer is a marker and reading what follows it; None if nothing
    does."""
    marker = "\u2063ANSWER\u2063"
    try:
        text = render_chat(template, [{"role": "user", "content": "Q"}, {"role": "assistant", "content": marker}],
                           add_generation_prompt=False, bos_token=bos_token, eos_token=eos_token)
    except ChatError:
        return None
    after = text.split(marker, 1)[1] if marker in text else ""
    after = after.strip().split("\n", 1)[0].strip()
    return after or None


__all__ = ["ChatError", "ROLES", "check_messages", "render_chat", "turn_end"]
