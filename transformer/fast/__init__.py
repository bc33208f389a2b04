"""The speed beside the paper: faster twins of the core's modules and of beam search's scoring,
each computing what its plain twin computes (tests/fast/test_fast_*.py compare them, values and
gradients). The core never imports this tier; a run or a ``Translator`` chooses it by name
(``train.fast``, ``fast=``):

    twins.py        speed_up(model): each module replaced by its fast twin
    dropout.py      dropout with a cheaper random mask on the CPU; ReLU and dropout with one mask
    layers.py       the feed-forward network's twin
    attention.py    multi-head attention's twin: beams that share a memory, one-copy cache appends
    output_loss.py  the training loss from the decoder's features, a block of rows at a time
    topk.py         each row's k largest scores in two cheap passes
    prepacked.py    beam search's linear layers on weights laid out once for the CPU
    search.py       beam search's scoring: blocks of rows, the log-softmax in place, the two-pass top-k

What each buys: docs/benchmarks.md, "Speed choices in the code".
"""
