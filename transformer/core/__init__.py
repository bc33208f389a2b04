"""The minimal framework: the whole Transformer of "Attention Is All You Need", its training step and its
decoding, on plain PyTorch tensors. It imports nothing from the rest of the package; read it in this order:

    masks.py           the mask convention: boolean, True = may attend (§3.2.3)
    attention.py       scaled dot-product attention (Eq. 1, §3.2.1) and multi-head attention (§3.2.2),
                       with the key/value cache of incremental decoding
    dropout.py         dropout (§5.4), with a cheaper random mask on the CPU
    layers.py          the feed-forward network (§3.3) and the encoder / decoder layers (§3.1):
                       residuals and LayerNorm, post-norm as in the paper or pre-norm
    embeddings.py      token embeddings × √d_model (§3.4) and sinusoidal positions (§3.5)
    model.py           Encoder, Decoder, Transformer: encode / decode / forward, tied embeddings (§3, Fig. 1)
    tokenizer.py       the shared SentencePiece vocabulary (§5.1) with fixed special ids
    batches.py         token ids -> length-bucketed, padded batches; tgt_in / tgt_out shifted right (§5.1)
    loss.py            label-smoothed cross-entropy (§5.4)
    optim.py           Adam with the warmup / inverse-square-root learning rate (§5.3)
    config.py          the settings: frozen dataclasses loaded from YAML, strict keys
    checkpoint.py      the checkpoint format: everything needed to translate, and to resume training
    topk.py            each row's k largest scores, the kernel of beam search
    decoding.py        greedy search and beam search with the key/value cache (§6.1)
    prepacked.py       beam search's linear layers on weights laid out once for the CPU (same math)
    batched_search.py  a list of sentences decoded in length-sorted batches, in input order

The training loop itself is ``train.py``'s, top to bottom; ``training/`` prepares its data and run folder,
``inference/`` adds the ``Translator`` API, ``interop/`` other people's formats.
"""
