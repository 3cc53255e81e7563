import pytest

from posttrain import UsageError
from posttrain.models.tokenizer import CharTokenizer


def test_roundtrip(tok):
    text = "<3+4+5>{3+4=7;7+5=12}12#"
    ids = tok.encode(text)
    assert len(ids) == len(text) and tok.decode(ids) == text


def test_specials_and_pad_is_dropped(tok):
    assert tok.decode([tok.user_id, tok.pad_id, tok.eot_id]) == "<#"
    assert tok.chat_prompt("3+4") == "<3+4>" and tok.chat_response("7") == "7#"
    assert len({tok.pad_id, tok.user_id, tok.assistant_id, tok.eot_id, tok.think_open_id, tok.think_close_id}) == 6


def test_unknown_character_names_it(tok):
    with pytest.raises(UsageError, match="'€'"):
        tok.encode("3+€")


def test_save_load(tmp_path):
    t = CharTokenizer(chars="_<>#{}0123456789+")
    t.save(tmp_path)
    assert CharTokenizer.load(tmp_path).chars == t.chars
