"""Offline training of EAGLE-3 draft heads (``eagle2-local train``; needs the ``train`` extra: torch).

Modules: ``data`` (readers), ``features`` (llama.cpp feature/distribution extraction and its disk cache),
``selfgen`` (the target's own answers as data), ``target_weights`` (what the head borrows from the target,
draft vocabulary), ``head`` (the torch module), ``loop`` (training-time test, checkpoints, evaluation),
``export`` (HF EAGLE-3 folder, GGUF conversion), ``pipeline`` (the whole job). Nothing here is imported by the
runtime, so the base package works without torch.
"""
