"""Build small byte-level BPE tokenizers in HunyuanOCR's tokenizer.json format.

The real tokenizer (spec §6) is a `tokenizers` byte-level BPE with a four-stage pre-tokenizer
(digits 1-3, CJK runs, GPT-style regex, ByteLevel without regex) and its special tokens appended
after the BPE vocabulary.  We reproduce that structure at a small vocabulary so that tiny test
checkpoints and the demo model exercise exactly the code paths the real files do.
"""

from __future__ import annotations

from collections.abc import Iterable

# Real special-token names (U+FF5C brackets, U+2581 spaces), in the order they are appended.
BOS = "<｜hy_begin▁of▁sentence｜>"
END_OF_SENTENCE = "<｜hy_end▁of▁sentence｜>"
PAD = "<｜hy_▁pad▁｜>"
USER = "<｜hy_User｜>"
ASSISTANT = "<｜hy_Assistant｜>"


def placeholder(n: int) -> str:
    """`<｜hy_place▁holder▁no▁N｜>`; real id = 120018 + N."""
    return f"<｜hy_place▁holder▁no▁{n}｜>"


SPECIAL_TOKENS: tuple[str, ...] = (
    BOS, END_OF_SENTENCE, PAD, USER, ASSISTANT,
    placeholder(0), placeholder(1), placeholder(2), placeholder(3),
    placeholder(100), placeholder(101), placeholder(102), placeholder(103),
)

# GPT-style split regex used by the real pre-tokenizer (third stage).
GPT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CJK_REGEX = "[一-龥぀-ゟ゠-ヿ]+"


def build_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Train a byte-level BPE on `corpus` with `vocab_size` BPE entries, then append the specials.

    Returns a `tokenizers.Tokenizer`; special ids are vocab_size .. vocab_size+len(SPECIAL_TOKENS)-1
    (or fewer BPE entries if the corpus is too small to reach vocab_size).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(CJK_REGEX), behavior="isolated"),
        pre_tokenizers.Split(Regex(GPT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        min_frequency=1,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def special_ids(tok) -> dict[str, int]:
    """Token ids a HunyuanVL config needs, looked up by their real names."""
    ids = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
    missing = [n for n, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"tokenizer lacks special tokens {missing}")
    return {
        "bos_token_id": ids[BOS],
        "pad_token_id": ids[PAD],
        "eos_token_id": ids[ASSISTANT],
        "eod_token_id": ids[placeholder(2)],
        "user_token_id": ids[USER],
        "system_sep_token_id": ids[placeholder(3)],
        "im_start_id": ids[placeholder(100)],
        "im_end_id": ids[placeholder(101)],
        "image_token_id": ids[placeholder(102)],
        "im_newline_id": ids[placeholder(103)],
    }


def tokenizer_config(tok) -> dict:
    """tokenizer_config.json in the shape HunyuanOCR 1.5 ships (TokenizersBackend)."""
    added = {}
    for name in SPECIAL_TOKENS:
        added[str(tok.token_to_id(name))] = {
            "content": name, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    return {
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": ASSISTANT,
        "pad_token": PAD,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "tokenizer_class": "TokenizersBackend",
        "processor_class": "HunYuanVLProcessor",
    }
