#!/usr/bin/env python3
"""Write tests/fixtures/chat/expected.json: chat templates rendered by transformers.

Needs only transformers and jinja2 (no torch):

    python3 -m venv .venv-chat && .venv-chat/bin/pip install transformers jinja2
    .venv-chat/bin/python tools/make_chat_fixtures.py

The tokenizer is the 512-token byte-level BPE of tests/fixtures/llama-gqa. The four
templates are written for these tests in the shapes chat models use: "multiline" (plain
block tags on lines of their own, which render right only with trim_blocks and
lstrip_blocks, as transformers sets them), "chatml" (role
headers between <|im_start|> and <|im_end|> markers, Python string methods), "headers"
(a BOS, header markers around each role, `~` concatenation, trimmed contents), and "inst"
(system prompt folded into the first user turn, [INST] ... [/INST] turns, assistant turns
closed by EOS, and raise_exception when roles do not alternate). For every template and
conversation, with and without add_generation_prompt, expected.json holds the text
transformers renders (`apply_chat_template(..., tokenize=False)`) and the token ids it
gives (`tokenize=True`: the rendered text encoded without adding special tokens), or the
error message when the template raises.

tools_expected.json does the same for templates that take tools: "hermes" (tool signatures
in a system block, calls written as <tool_call> JSON, results as <tool_response> turns, and
an `enable_thinking` keyword argument as Qwen3 templates have) and "json_tools" (signatures
written with `tojson(indent=4)`), rendered with and without tools, calls, results and
keyword arguments.
"""

import json
from pathlib import Path

from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "chat"

TEMPLATES = {
    # Plain {% %} tags on lines of their own: only right with trim_blocks and lstrip_blocks.
    "multiline": """{% for message in messages %}
    {% if message.role == 'system' %}
<<SYS>>{{ message.content }}<</SYS>>
    {% else %}
[{{ message.role | upper }}] {{ message.content }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
[ASSISTANT]
{% endif %}""",
    "chatml": (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    ),
    "headers": (
        "{{- bos_token -}}"
        "{%- for m in messages -%}"
        "{{- '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\\n\\n' ~ (m.content | trim) ~ '<|eot_id|>' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif -%}"
    ),
    "inst": (
        "{%- if messages[0]['role'] == 'system' -%}"
        "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
        "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
        "{{- bos_token -}}"
        "{%- for message in turns -%}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
        "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
        "{%- endif -%}"
        "{%- if message['role'] == 'user' -%}"
        "{%- if loop.first and system -%}{{- '[INST] ' + system + '\\n\\n' + message['content'] + ' [/INST]' -}}"
        "{%- else -%}{{- '[INST] ' + message['content'] + ' [/INST]' -}}{%- endif -%}"
        "{%- else -%}{{- ' ' + message['content'] + eos_token -}}{%- endif -%}"
        "{%- endfor -%}"
    ),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  Name a colour.  "},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one"},
    ],
    [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two in a row"},
    ],
]


TOOL_TEMPLATES = {
    "hermes": """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- 'You may call functions. Their signatures, one JSON object per line, are inside <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nTo call one, write its name and arguments as JSON inside <tool_call></tool_call>:\\n<tool_call>\\n{\"name\": <name>, \"arguments\": <object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
  {%- if message.role == 'system' %}
  {%- elif message.role == 'assistant' and message.tool_calls is defined %}
    {{- '<|im_start|>assistant' }}
    {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
    {%- for call in message.tool_calls %}
      {%- set f = call.function %}
      {{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
  {%- elif message.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
  {%- else %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|im_start|>assistant\\n' }}
  {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}""",
    "json_tools": """{{- bos_token }}
{%- if tools is not none %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\nAnswer with a call: {\"name\": ..., \"parameters\": ...}.\\n\\n' }}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls is defined %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- for c in m.tool_calls %}{{- '{\"name\": \"' + c.function.name + '\", \"parameters\": ' + (c.function.arguments | tojson) + '}' }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- elif m.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}""",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, now.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "For example Zürich"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            },
        },
    },
]

TOOL_CONVERSATIONS = [
    [{"role": "user", "content": "Is it raining in Oslo?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich and news about it?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_a1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}},
                },
                {
                    "id": "call_b2",
                    "type": "function",
                    "function": {"name": "search", "arguments": {"query": "Zürich \"news\"", "limit": 3}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a1", "content": "{\"temp\": 4.5}"},
        {"role": "tool", "tool_call_id": "call_b2", "content": "[]"},
        {"role": "user", "content": "Thanks"},
    ],
]

# (tools?, conversation, keyword arguments)
TOOL_CASES = [
    (True, 0, {}),
    (True, 1, {}),
    (False, 0, {}),
    (False, 0, {"enable_thinking": False}),
    (True, 1, {"enable_thinking": True}),
]


def tool_cases(tok):
    cases = []
    for name, template in TOOL_TEMPLATES.items():
        for with_tools, ci, kwargs in TOOL_CASES:
            for agp in (True, False):
                text = tok.apply_chat_template(
                    TOOL_CONVERSATIONS[ci],
                    tools=TOOLS if with_tools else None,
                    chat_template=template,
                    tokenize=False,
                    add_generation_prompt=agp,
                    **kwargs,
                )
                cases.append(
                    {
                        "template": name,
                        "tools": with_tools,
                        "conversation": ci,
                        "kwargs": kwargs,
                        "add_generation_prompt": agp,
                        "text": text,
                    }
                )
    return cases


def main():
    src = ROOT / "tests" / "fixtures" / "llama-gqa" / "tokenizer.json"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(src), bos_token="<s>", eos_token="</s>")
    cases = []
    for name, template in TEMPLATES.items():
        for ci, messages in enumerate(CONVERSATIONS):
            for agp in (True, False):
                case = {
                    "template": name,
                    "conversation": ci,
                    "add_generation_prompt": agp,
                }
                try:
                    text = tok.apply_chat_template(
                        messages, chat_template=template, tokenize=False, add_generation_prompt=agp
                    )
                    ids = tok.apply_chat_template(
                        messages,
                        chat_template=template,
                        tokenize=True,
                        add_generation_prompt=agp,
                        return_dict=False,
                    )
                    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                        ids = ids["input_ids"]
                    case["text"] = text
                    case["ids"] = list(ids)
                except Exception as e:  # the template raised
                    case["error"] = str(e)
                cases.append(case)
    OUT.mkdir(parents=True, exist_ok=True)
    import transformers

    doc = {
        "note": "chat templates rendered by transformers' apply_chat_template; see tools/make_chat_fixtures.py",
        "transformers": transformers.__version__,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "templates": TEMPLATES,
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    (OUT / "expected.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {OUT / 'expected.json'}")
    tools = tool_cases(tok)
    doc = {
        "note": "chat templates with tools rendered by transformers' apply_chat_template; see tools/make_chat_fixtures.py",
        "transformers": transformers.__version__,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "templates": TOOL_TEMPLATES,
        "tools": TOOLS,
        "conversations": TOOL_CONVERSATIONS,
        "cases": tools,
    }
    (OUT / "tools_expected.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(tools)} cases to {OUT / 'tools_expected.json'}")


if __name__ == "__main__":
    main()
