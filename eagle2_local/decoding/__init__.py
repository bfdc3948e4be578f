"""Decoding: the target's batched passes over a tree (target), trees and their growth (tree), acceptance,
sampling, stop strings, grammars and their guards, the feature backlog, and the generation loop that draws them
together (generator)."""
