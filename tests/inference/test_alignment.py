"""Word alignments pinned pair by pair on a hand-made cross-attention (transformer/inference/alignment.py, and
``Translator.alignments_of`` over a ``SentenceAttention``): SentencePiece sub-words merged into words, the
EOS row and column left out, both row conventions, heads averaged, the layer chosen.

Every expected list below is worked out by hand from its matrix, in the comments next to it.

    source pieces  ▁Ein  ▁H  und  ▁läuft  .   (+ </s>)     source words  0 Ein   1 Hund   2 läuft.
    source word    0     1   1    2       2
    target pieces  ▁A    ▁do  g   ▁runs   .   (+ </s>)     target words  0 A     1 dog    2 runs.
    target word    0     1    1   2       2
"""

from types import SimpleNamespace

import pytest
import torch

from transformer.core.config import EvalConfig, ModelConfig
from transformer.core.model import Transformer
from transformer.inference.alignment import word_alignment
from transformer.inference.translator import Translator
from transformer.runtime.attention_maps import SentenceAttention

SRC = ["▁Ein", "▁H", "und", "▁läuft", "."]
TGT = ["▁A", "▁do", "g", "▁runs", "."]
EOS = "</s>"

# Rows: what each decoder step predicts (row t predicts TGT[t]; row 5 predicts </s>). Columns: SRC + </s>.
# The argmax over the 5 source columns (the </s> column left out) of each row, and its source word:
M = torch.tensor(
    [  # ▁Ein  ▁H   und  ▁läuft .    </s>
        [0.45, 0.05, 0.05, 0.35, 0.05, 0.05],  # row 0 ▁A:    col 0 ▁Ein   -> word 0
        [0.05, 0.20, 0.50, 0.10, 0.05, 0.10],  # row 1 ▁do:   col 2 und    -> word 1
        [0.05, 0.30, 0.05, 0.05, 0.05, 0.50],  # row 2 g:     col 1 ▁H     -> word 1 (</s> is the row's max)
        [0.05, 0.05, 0.10, 0.70, 0.05, 0.05],  # row 3 ▁runs: col 3 ▁läuft -> word 2
        [0.05, 0.05, 0.35, 0.25, 0.20, 0.10],  # row 4 .:     col 2 und    -> word 1
        [0.60, 0.05, 0.05, 0.05, 0.10, 0.15],  # row 5 </s>:  col 0 ▁Ein   -> word 0
    ]
)

# rows="predicted": target piece t takes row t; the </s> row 5 takes part in nothing.
#   piece 0 ▁A (word 0) <- row 0 -> src word 0: (0, 0)
#   piece 1 ▁do (word 1) <- row 1 -> src word 1: (1, 1)
#   piece 2 g (word 1)   <- row 2 -> src word 1: (1, 1) again
#   piece 3 ▁runs (word 2) <- row 3 -> src word 2: (2, 2)
#   piece 4 . (word 2)   <- row 4 -> src word 1: (1, 2)
PREDICTED = [(0, 0), (1, 1), (1, 2), (2, 2)]

# rows="input": target piece t takes row t + 1, the step that reads it; the last piece takes the </s> row.
#   piece 0 ▁A (word 0)    <- row 1 -> src word 1: (1, 0)
#   piece 1 ▁do (word 1)   <- row 2 -> src word 1: (1, 1)
#   piece 2 g (word 1)     <- row 3 -> src word 2: (2, 1)
#   piece 3 ▁runs (word 2) <- row 4 -> src word 1: (1, 2)
#   piece 4 . (word 2)     <- row 5 -> src word 0: (0, 2)
INPUT = [(0, 2), (1, 0), (1, 1), (1, 2), (2, 1)]

# rows="input" when the translation stopped without </s> (no row 5): the last piece keeps the last row.
#   pieces 0-3 as above; piece 4 . (word 2) <- row 4 -> src word 1: (1, 2), already there
INPUT_WITHOUT_EOS = [(1, 0), (1, 1), (1, 2), (2, 1)]


def test_sub_words_map_to_their_words_and_eos_row_and_column_are_left_out():
    assert word_alignment(M, SRC, TGT) == PREDICTED
    assert word_alignment(M, SRC, TGT, rows="predicted") == PREDICTED  # the default


def test_input_rows_are_shifted_by_one_and_the_last_piece_reads_the_eos_row():
    assert word_alignment(M, SRC, TGT, rows="input") == INPUT
    assert word_alignment(M[:5], SRC, TGT, rows="input") == INPUT_WITHOUT_EOS
    assert word_alignment(M[:5], SRC, TGT) == PREDICTED  # predicted rows never needed row 5


def test_a_word_of_three_pieces_is_one_word():
    """Source "▁lä" "uft" "." is one word (2): pieces without "▁" continue the word before, however many."""
    src = ["▁Ein", "▁H", "und", "▁lä", "uft", "."]  # words 0 1 1 2 2 2
    weights = torch.tensor(
        [  # ▁Ein ▁H   und  ▁lä  uft  .    </s>
            [0.10, 0.05, 0.05, 0.05, 0.05, 0.60, 0.10],  # row 0 ▁A:    col 5 .   -> word 2: (2, 0)
            [0.05, 0.20, 0.50, 0.10, 0.05, 0.05, 0.05],  # row 1 ▁do:   col 2 und -> word 1: (1, 1)
            [0.05, 0.30, 0.05, 0.05, 0.05, 0.05, 0.45],  # row 2 g:     col 1 ▁H  -> word 1: (1, 1)
            [0.05, 0.05, 0.10, 0.10, 0.60, 0.05, 0.05],  # row 3 ▁runs: col 4 uft -> word 2: (2, 2)
            [0.50, 0.05, 0.10, 0.10, 0.10, 0.05, 0.10],  # row 4 .:     col 0 ▁Ein -> word 0: (0, 2)
            [0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.70],  # row 5 </s>:  not a target piece
        ]
    )
    assert word_alignment(weights, src, TGT) == [(0, 2), (1, 1), (2, 0), (2, 2)]


# ---------------------------------------------------------------- Translator.alignments_of


PIECES = {0: "<pad>", 1: "<unk>", 2: "<s>", 3: EOS}


def translator(n_decoder_layers: int) -> Translator:
    """A Translator around an untrained model (only its layer count matters here) and a tokenizer that
    knows its special pieces."""
    layers = n_decoder_layers
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=layers)
    tokenizer = SimpleNamespace(eos_id=3, id_to_piece=lambda ids: [PIECES[i] for i in ids])
    return Translator(Transformer(config, 10, 10, 0, 2, 3), tokenizer, EvalConfig())


def attention(rows: int) -> SentenceAttention:
    """3 decoder layers of 2 heads over M's first ``rows`` rows (6: the translation ended with </s>).
    Layer 1 holds M as the mean of two heads that each, alone, would align differently:
        head 0 = M + E, head 1 = M - E, E row 0 = +.15 at col 0, -.15 at col 3; row 4 = -.15 col 2, +.15 col 3
        head 0 row 4: .05 .05 .20 .40 .20 -> col 3 (word 2): (2, 2) instead of (1, 2)
        head 1 row 0: .30 .05 .05 .50 .05 -> col 3 (word 2): (2, 0) instead of (0, 0)
    Layers 0 and 2 attend from every row to col 3 "▁läuft" (word 2): (2, 0), (2, 1), (2, 2)."""
    E = torch.zeros(6, 6)
    E[0, 0], E[0, 3], E[4, 2], E[4, 3] = 0.15, -0.15, -0.15, 0.15
    decoy = torch.zeros(2, 6, 6)
    decoy[:, :, 3] = 1.0
    cross = [decoy, torch.stack([M + E, M - E]), decoy]
    target = TGT + [EOS] if rows == 6 else TGT
    return SentenceAttention(
        source_pieces=SRC + [EOS],
        target_pieces=target,
        input_pieces=["<s>"] + TGT[: rows - 1],
        cross=[w[:, :rows] for w in cross],
        encoder_self=[],
        decoder_self=[],
    )


def test_alignments_of_averages_the_heads_of_the_penultimate_layer():
    t = translator(n_decoder_layers=3)
    assert t.default_align_layer() == 1
    assert t.alignments_of(attention(6)) == PREDICTED  # the </s> target piece and </s> source column out
    assert t.alignments_of(attention(6), rows="input") == INPUT
    assert t.alignments_of(attention(5)) == PREDICTED  # no </s>: the target pieces are kept whole
    assert t.alignments_of(attention(5), rows="input") == INPUT_WITHOUT_EOS
    decoy = [(2, 0), (2, 1), (2, 2)]  # every target word to source word 2
    assert t.alignments_of(attention(6), layer=0) == decoy
    assert t.alignments_of(attention(6), layer=-1) == decoy
    with pytest.raises(ValueError, match="layer 3 out of range: the decoder has 3 layers"):
        t.alignments_of(attention(6), layer=3)


def test_alignments_of_a_one_layer_decoder_take_its_only_layer():
    t = translator(n_decoder_layers=1)
    assert t.default_align_layer() == 0
    one = attention(6)
    one.cross = one.cross[1:2]  # M's layer alone
    assert t.alignments_of(one) == PREDICTED
