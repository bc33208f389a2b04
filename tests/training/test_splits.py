"""The splits' token ids: each sentence encoded as the tokenizer encodes it alone, and the cleaning
rules (length, empty sides) counted."""

from transformer.runtime.configs import DataConfig
from transformer.training.splits import clean_pairs, encode_split


def test_encode_split_matches_encode(de_en, tokenizer):
    split = de_en["validation"]
    src_ids, tgt_ids = encode_split(split, tokenizer)
    assert len(src_ids) == len(tgt_ids) == 1014
    for i in (7, 3, 1000):
        assert src_ids[i] == tokenizer.encode(split.src[i])
        assert tgt_ids[i] == tokenizer.encode(split.tgt[i])


def test_clean_pairs_max_len():
    # rows are length + 1 (EOS / BOS): with max_len 5, lengths up to 4 fit; an empty side is dropped first
    kept, counts = clean_pairs([4, 5, 1, 4], [4, 1, 5, 0], None, DataConfig(max_len=5))
    assert kept.tolist() == [0]
    assert counts == {"pairs": 4, "empty": 1, "too_long": 2, "ratio": 0, "duplicate": 0, "kept": 1}
