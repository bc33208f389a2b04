"""A training run around the core: corpora and data sources, the token store and its cache, cleaning,
the run folder and its resumable checkpoints, devices, precisions and ranks, validation and the final test,
reporting to TensorBoard, checkpoint averaging, the moving average of the weights, and fine-tuning.

``model_formats.py`` is the one door to ``interop/``: it imports it only when a released model is met.
"""
