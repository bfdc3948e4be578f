"""Draft trees as numpy arrays: what a draft proposes (proposals, top-k), how a tree is grown and selected from
them, and the sampling rule that verification accepts by. No llama.cpp here."""
