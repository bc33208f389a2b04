"""Word alignments from cross-attention: sub-words merged into words, Pharaoh ``i-j`` pairs.

The rule (measured by ``bench/alignment_quality.py``, see ``docs/alignments.md``): take one decoder layer's
cross-attention, average its heads, drop the EOS row and column, link each target sub-word to the source
sub-word it attends to most, and map both to their words. A word starts at a SentencePiece piece that
begins with "▁" (U+2581, the word-start marker); a piece without it continues the word before.

    pieces  ▁Ein  ▁Hund  ▁rennt  .        words  0 Ein   1 Hund   2 rennt.
    word    0     1      2       2

Words are therefore the whitespace-separated words of the text as the tokenizer normalises it (nmt_nfkc:
for ordinary text, ``line.split()``). Rows: "predicted" (row t is the decoder step that predicts target
token t, as fairseq's ``--print-alignment``) or "input" (row t + 1, the step that reads token t: Chen et
al. 2020's shifted attention).
"""

import torch

WORD_START = "\u2581"  # "▁"


def word_index(pieces: list[str]) -> list[int]:
    """The word of each sub-word piece (0-based). A "▁" piece with no text of its own joins the next word
    (or, at the end, the word before), so that every word has some text."""
    index, word, has_text = [], -1, False
    for piece in pieces:
        if word < 0 or (piece.startswith(WORD_START) and has_text):
            word, has_text = word + 1, False
        has_text = has_text or bool(piece.replace(WORD_START, ""))
        index.append(word)
    if index and not has_text and word > 0:  # a trailing bare "▁": part of the last word with text
        index = [min(i, word - 1) for i in index]
    return index


def word_alignment(
    weights: torch.Tensor, src_pieces: list[str], tgt_pieces: list[str], rows: str = "predicted"
) -> list[tuple[int, int]]:
    """weights (T', S') of one layer, heads averaged, rows and columns as ``Translator.attention_ids``
    labels them (source pieces + EOS; target pieces, + EOS when the translation ended with one) ->
    sorted (source word, target word) pairs. ``src_pieces`` / ``tgt_pieces``: without EOS."""
    if rows not in ("predicted", "input"):
        raise ValueError(f"rows must be 'predicted' or 'input', got {rows!r}")
    S, T = len(src_pieces), len(tgt_pieces)
    if S == 0 or T == 0:
        return []
    row_of = torch.arange(T)  # (T,) the row that predicts target piece t
    if rows == "input":  # the row that reads piece t; the last piece has one only when EOS was predicted
        row_of = (row_of + 1).clamp(max=weights.size(0) - 1)  # (T,)
    best = weights[row_of, :S].argmax(dim=-1).tolist()  # (T,) the source piece each target piece attends to
    src_words, tgt_words = word_index(src_pieces), word_index(tgt_pieces)
    return sorted({(src_words[s], tgt_words[t]) for t, s in enumerate(best)})


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """[(0, 0), (1, 2)] -> "0-0 1-2"."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
