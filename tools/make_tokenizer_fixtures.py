"""Writes tests/fixtures/gguf/spm-tokenizer.{gguf,json}: a SentencePiece tokenizer as a GGUF
file holds it (`tokenizer.ggml.model` "llama": pieces, scores and piece types), and the ids
and text that SentencePiece itself gives for a set of strings, the reference that pagellm's
tokenizer built from GGUF metadata (src/gguf/tokenizer.rs) must reproduce.

The model is a small SentencePiece BPE (vocabulary 400, byte fallback, digits split, no
normalisation and no whitespace folding: the settings of Llama 2's tokenizer.model) trained
on a seeded synthetic corpus, so the fixture is reproducible and holds no third-party text.
The GGUF metadata follows what llama.cpp's converter writes for such a model: piece types
1 normal, 2 unknown, 3 control, 6 byte; BOS, EOS and unknown ids; add_bos_token true,
add_eos_token false, add_space_prefix true; and a small chat template. The file has no
tensors.

Run from the repository root:

    python3 -m venv venv && venv/bin/pip install gguf==0.19.0 numpy sentencepiece==0.2.3
    venv/bin/python tools/make_tokenizer_fixtures.py

Tests read the committed files; they never need Python.
"""

import io
import json
import random

import gguf
import sentencepiece as spm

OUT = "tests/fixtures/gguf/spm-tokenizer"

WORDS = (
    "the a of to and in is it you that he was for on are with as I his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come "
    "did number sound no most people my over know water than call first who may down side "
    "been now find café naïve über año 42 1999 3.14 2026 don't it's we'll they've"
).split()

# Strings whose tokenization is checked: spaces (leading, repeated, alone), digits, words
# seen and unseen in training, characters outside the vocabulary (byte fallback), newlines
# and tabs, an empty string.
TEXTS = [
    "the water was hot",
    " leading space",
    "two  spaces and   three",
    " ",
    "   ",
    "",
    "numbers 1 12 123 1234 and 3.14159",
    "café naïve über año",
    "unseen words: zebra quixotic jumbo",
    "line one\nline two\n\n\ttabbed",
    "emoji 🦀🚀 and 日本語 fall back to bytes",
    "don't stop; we'll see what they've done",
    "trailing newline\n",
    "MiXeD CaSe",
]


# A chat template in the file's metadata (tokenizer.chat_template), using the BOS and EOS
# tokens the runtime passes to templates.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}"
)


def corpus(rng: random.Random) -> str:
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(n)))
    return "\n".join(lines)


def main() -> None:
    rng = random.Random(2026)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(rng).split("\n")),
        model_writer=model,
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)

    w = gguf.GGUFWriter(OUT + ".gguf", "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template(CHAT_TEMPLATE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    cases = []
    for text in TEXTS:
        ids = sp.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": sp.decode(ids)})
    with open(OUT + ".json", "w", encoding="utf-8") as f:
        json.dump(
            {"vocab_size": len(tokens), "bos": sp.bos_id(), "eos": sp.eos_id(), "cases": cases},
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")
    print(f"wrote {OUT}.gguf ({len(tokens)} pieces) and {OUT}.json ({len(cases)} cases)")


if __name__ == "__main__":
    main()
