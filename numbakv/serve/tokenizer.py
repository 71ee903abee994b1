"""Tokenizers: text to token ids and back.

`Tokenizer` is what the `Engine` needs of one (a vocabulary size, `encode`, `decode`);
`ByteTokenizer` is the byte-level one the toy model uses: each UTF-8 byte is a token.

    tokenizer = ByteTokenizer()
    tokenizer.encode("hé")          # [104, 195, 169]
    tokenizer.decode([104, 0xFF])   # "h\ufffd": invalid UTF-8 becomes U+FFFD
"""

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

VOCAB_SIZE = 256  # the byte tokenizer's vocabulary: one token per byte value


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token ids in [0, vocab_size) and back."""

    @property
    def vocab_size(self) -> int:
        """Token ids this tokenizer produces lie in [0, vocab_size)."""

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, in order."""

    def decode(self, tokens: Iterable[int]) -> str:
        """The text of token ids `tokens`."""


def encode(text: str) -> list[int]:
    """The UTF-8 bytes of `text`, one token each."""
    return list(text.encode("utf-8"))


def decode(tokens: Iterable[int]) -> str:
    """The text of byte tokens; invalid UTF-8 becomes U+FFFD."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


class ByteTokenizer:
    """The byte-level tokenizer: 256 tokens, one per UTF-8 byte (see `encode`, `decode`)."""

    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of `text`, one token each."""
        return encode(text)

    def decode(self, tokens: Iterable[int]) -> str:
        """The text of byte tokens; invalid UTF-8 becomes U+FFFD."""
        return decode(tokens)

    def __repr__(self) -> str:
        return "ByteTokenizer()"


BYTE_TOKENIZER = ByteTokenizer()  # the default of `Engine(tokenizer=...)`
