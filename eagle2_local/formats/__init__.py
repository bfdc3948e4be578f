"""GGUF files: reading metadata fields and tensors, this project's own keys, the EAGLE-1/2 head layout, layer
drafts cut from a model, finding models on disk, writing files atomically, and the one cache folder."""
