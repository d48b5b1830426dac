"""Chapter 18's SentencePiece reader serves every GGUF whose tokenizer.ggml.model is 'llama' (Llama 2, Mistral and
Gemma files alike), so Gemma's chat template and its <end_of_turn> stop go only to a gemma3 file."""
import pytest
from gguf import GGUFWriter

from helios.formats.gguf import GGUFFile
from helios.model.gemma3 import GEMMA3_END_OF_TURN, gemma3_tokenizer
from helios.tokenizer import CONTROL_TOKEN, load_tokenizer

NORMAL = 1   # llama.cpp's token type of a plain vocabulary entry
VOCAB = ["<unk>", "<s>", "</s>", GEMMA3_END_OF_TURN, "<0x41>", "▁", "h", "i", "hi", "▁hi"]


def sentencepiece_gguf(path, arch: str, template: str | None = None):
    w = GGUFWriter(path, arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(VOCAB)
    w.add_token_scores([0.0] * len(VOCAB))
    w.add_token_types([CONTROL_TOKEN if t.startswith("<") and not t.startswith("<0x") else NORMAL for t in VOCAB])
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
    if template: w.add_chat_template(template)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


def test_a_gemma3_file_without_a_template_gets_gemmas_turns(tmp_path):
    tok = gemma3_tokenizer(GGUFFile(sentencepiece_gguf(tmp_path / "g.gguf", "gemma3")))
    assert tok.eos_token_ids == {2, 3}
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert "<start_of_turn>user\nhi<end_of_turn>" in prompt and prompt.endswith("<start_of_turn>model\n")


def test_another_sentencepiece_file_keeps_its_own_turns_or_has_none(tmp_path):
    plain = load_tokenizer(sentencepiece_gguf(tmp_path / "l.gguf", "llama"))   # found by tokenizer.ggml.model
    assert plain.eos_token_ids == {2} and plain.chat_template_source is None
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "hi"}])
    own = "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"
    mistral = load_tokenizer(sentencepiece_gguf(tmp_path / "m.gguf", "llama", own))
    assert mistral.chat_template_source == own and mistral.eos_token_ids == {2}
    assert mistral.encode("hi", add_special_tokens=False) == [VOCAB.index("hi")]
