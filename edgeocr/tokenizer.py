"""tokenizer.json through the `tokenizers` library (byte-level BPE, spec §6)."""

from __future__ import annotations

from pathlib import Path

from edgeocr.errors import ArtifactError


def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's alphabet reversed (GPT-2's bytes_to_unicode): the character a vocabulary entry writes for
    each byte -> that byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:                         # control bytes, space, NBSP, soft hyphen: shifted past 255
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _utf8_length(lead: int) -> int:
    """Bytes of the UTF-8 character whose first byte is `lead` (1 for a byte that cannot start one)."""
    for bits, n in ((0x80, 1), (0xE0, 2), (0xF0, 3), (0xF8, 4)):
        if lead & bits == (bits << 1) & 0xFF:
            return n
    return 1


_BYTE_OF_CHAR = _byte_of_char()


class Tokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception
            raise ArtifactError(f"{path}: cannot be loaded as tokenizer.json ({e})") from None

    def encode(self, text: str) -> list[int]:
        """Plain text -> ids, no special tokens added (the prompt layout adds them)."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def ends_inside_a_character(self, ids: list[int]) -> bool:
        """Whether the bytes of `ids` end inside a UTF-8 character: byte-level BPE writes a character in one to
        four tokens, and a page cut off between them decodes to a replacement character at its end.  False where
        the last tokens are not byte-level vocabulary entries (a special token, another tokenizer kind)."""
        tail = b""
        for i in reversed(list(ids)[-4:]):
            piece = self.tok.id_to_token(int(i))
            if piece is None or any(c not in _BYTE_OF_CHAR for c in piece):
                break
            tail = bytes(_BYTE_OF_CHAR[c] for c in piece) + tail
        for back, b in enumerate(reversed(tail[-4:]), 1):
            if b & 0xC0 != 0x80:                   # not a continuation byte: the last character starts here
                return back < _utf8_length(b)
        return False

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)
