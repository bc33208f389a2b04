"""A training run around the core: data sources, the token store and its cache, cleaning and mixing
corpora, the run folder and its resumable checkpoints, ranks, validation and the final test, reporting to
TensorBoard, checkpoint averaging, the moving average of the weights, and fine-tuning.
"""
