"""The attention lesson, section by section: bench/attention_lesson.py prints it, docs/attention.md shows it.

Every number is computed with the project's own attention (``transformer.attention``), masks
(``transformer.masks``) and multi-head attention; NumPy and PyTorch's own functions appear only as the
reference a number is checked against.
"""
