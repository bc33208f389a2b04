"""The attention lesson, section by section: lesson/attention_lesson.py prints it, docs/attention.md shows it.

Every number is computed with the project's own attention (``transformer.core.attention``), masks
(``transformer.core.masks``) and multi-head attention; NumPy and PyTorch's own functions appear only as the
reference a number is checked against.
"""
