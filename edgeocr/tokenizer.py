"""tokenizer.json through the `tokenizers` library (byte-level BPE, spec §6)."""

from __future__ import annotations

from pathlib import Path

from edgeocr.errors import ArtifactError


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

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)
