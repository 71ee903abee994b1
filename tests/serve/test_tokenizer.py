"""`numbakv.serve.tokenizer`: the byte tokenizer, the `Tokenizer` protocol, and the module
functions `numbakv.serve.model` still exports."""

import numbakv
from numbakv.serve.tokenizer import BYTE_TOKENIZER, ByteTokenizer, Tokenizer, decode, encode

TEXT = "cells — ünïcode ✓"


def test_byte_tokenizer_round_trip():
    bytes_ = ByteTokenizer()
    tokens = bytes_.encode(TEXT)
    assert bytes_.decode(tokens) == TEXT
    assert tokens == list(TEXT.encode("utf-8")) and len(tokens) > len(TEXT)
    assert all(0 <= t < bytes_.vocab_size for t in tokens) and bytes_.vocab_size == 256
    assert bytes_.decode([0xFF, ord("a")]) == "\ufffda"  # invalid UTF-8
    assert bytes_.decode([]) == "" and bytes_.encode("") == []


def test_the_module_functions_are_the_byte_tokenizer():
    assert encode(TEXT) == BYTE_TOKENIZER.encode(TEXT)
    assert decode([0xE2, 0x9C, 0x93, 0xC3]) == BYTE_TOKENIZER.decode([0xE2, 0x9C, 0x93, 0xC3])


class Letters:
    """26 tokens, a..z; anything else is refused."""

    vocab_size = 26

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") for c in text]

    def decode(self, tokens) -> str:
        return "".join(chr(ord("a") + t) for t in tokens)


def test_the_protocol_takes_any_class_with_its_members():
    assert isinstance(ByteTokenizer(), Tokenizer) and isinstance(Letters(), Tokenizer)
    assert not isinstance(object(), Tokenizer)
    assert not isinstance(encode, Tokenizer)
    assert numbakv.ByteTokenizer is ByteTokenizer
    assert repr(BYTE_TOKENIZER) == "ByteTokenizer()"
