"""The minimal framework: the whole Transformer of "Attention Is All You Need", its training loss and its
decoding, in plain PyTorch. It imports nothing from the rest of the package. The shapes, everywhere:

    B batch   S source length   T target length   D d_model   H heads   Dh head size (D / H)
    F d_ff    V vocabulary      K beam size

Read it in this order:

    masks.py           the mask convention: boolean, True = may attend (§3.2.3)
    attention.py       scaled dot-product attention (Eq. 1, §3.2.1) and multi-head attention (§3.2.2),
                       with the key/value cache of incremental decoding
    layers.py          the feed-forward network (§3.3) and the encoder / decoder layers (§3.1):
                       residuals, dropout (§5.4) and LayerNorm, post-norm as in the paper or pre-norm
    embeddings.py      token embeddings × √d_model (§3.4) and sinusoidal positions (§3.5)
    model.py           Encoder, Decoder, Transformer: encode / decode / forward, tied embeddings (§3, Fig. 1)
    tokenizer.py       the shared SentencePiece vocabulary (§5.1) with fixed special ids
    batches.py         token ids -> length-bucketed, padded batches; tgt_in / tgt_out shifted right (§5.1)
    loss.py            label-smoothed cross-entropy (§5.4)
    optim.py           Adam with the warmup / inverse-square-root learning rate (§5.3)
    config.py          the settings: frozen dataclasses with strict keys
    checkpoint.py      the checkpoint format: everything needed to translate
    decoding.py        greedy search and beam search with the key/value cache (§6.1)

A training step is ``loss.token_loss(model(src, tgt_in), tgt_out, ...)``, then Adam at the §5.3 rate.
"""
