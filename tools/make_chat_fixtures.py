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


if __name__ == "__main__":
    main()
