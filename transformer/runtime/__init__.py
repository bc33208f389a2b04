"""What training, translating and serving share, below all three: reading configs and models (the one door
to ``interop/``), devices and precisions, freed memory kept for the next step on the CPU, the batched
search, the line policy, metrics, attention maps and their plots, a model's corpora and languages, the
command-line usage parser and the library-chatter silencer.
"""
