"""Tokenizer behaviour that streaming and chat depend on."""
import random

import pytest

from helios.tokenizer import IncrementalDetokenizer, REPLACEMENT_CHAR, load_tokenizer, tokenizer_from_folder


@pytest.fixture(scope="module")
def tok(smollm2_gguf):
    return load_tokenizer(smollm2_gguf)


def test_streamed_deltas_add_up_and_never_split_a_character(tok):
    rng = random.Random(0)
    alphabet = "abc xyz éàü ß 東京 🌍🚀🍕 👩‍👩‍👧 \n\t0123 ¿¡ Ω"
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        detok = IncrementalDetokenizer(tok)
        deltas = [detok.push(i) for i in tok.encode(text)] + [detok.flush()]
        assert "".join(deltas) == text
        assert not any(REPLACEMENT_CHAR in d for d in deltas)


def test_chat_template_renders_roles_in_order(tok):
    text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                                    {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}])
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                    "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        tok.apply_chat_template([{"role": "user"}])


def test_folder_tokenizer_reads_template_and_eos(tmp_path, tok):
    import json
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}", "eos_token": "<|im_end|>",
         "bos_token": {"content": "<|im_start|>"}}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    folder_tok = tokenizer_from_folder(tmp_path)
    assert folder_tok.eos_token_ids == {0, 2} and folder_tok.bos_token == "<|im_start|>"
    assert folder_tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[hi]"
    assert folder_tok.encode("hello world") == tok.encode("hello world")
