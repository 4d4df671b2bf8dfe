"""Multilingual UI-string translation data: corpus preparation from pinned
wheels (prepare), SentencePiece vocabularies (vocab), tf.data input
generators with temperature sampling (inputs) and statistics (stats)."""
