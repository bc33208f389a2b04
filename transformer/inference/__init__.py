"""Translating with a trained model: the ``Translator`` (the user-facing decoding API, built on the core's
searches), int8 quantization, sampling, word alignments and attention inspection,
and ``translate.py``'s options and text lines.
"""
