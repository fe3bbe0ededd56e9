"""Built-in chat templates, selectable by name in `tokenizer.chat_template`.

Each renders incrementally (a conversation's render starts with the render of its first turns
plus the generation prompt), which is what the loss mask derivation in `chat.py` relies on.
"""

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

ALPACA = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '### Instruction:\\n' + message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '### Response:\\n' + message['content'] + eos_token + '\\n\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Response:\\n' }}{% endif %}"
)

SQUAD = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ 'Answer: ' + message['content'] + eos_token + '\\n\\n' }}"
    "{% else %}{{ message['content'] + '\\n\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Answer: ' }}{% endif %}"
)

BUILTIN_TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "alpaca": ALPACA, "squad": SQUAD}


def resolve_template(value: str) -> str:
    """A built-in template by name, or `value` itself as a Jinja template."""
    return BUILTIN_TEMPLATES.get(value, value)
