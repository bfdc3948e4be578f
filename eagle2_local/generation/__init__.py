"""The generation loop: plain decoding, and draft -> verify -> accept -> commit rounds."""
