"""The GGUF metadata keys the package reads and writes, in one place (as gguf-py's ``constants.py`` keeps
llama.cpp's, whose names these follow). A key with ``{arch}`` lives under an architecture's prefix:
``BLOCK_COUNT.format(arch=info.architecture)``.

Standard keys, llama.cpp's ``eagle3`` keys (as the pinned llama.cpp reads them) and our own ``eagle2_local.*``
provenance keys. The EAGLE-1/2 head schema (architecture ``eagle1``) is ``eagle1_format.py``.
"""

# ---------------------------------------------------------------- standard keys
ARCHITECTURE = "general.architecture"
ALIGNMENT = "general.alignment"

TOKENIZER_PREFIX = "tokenizer."
TOKENS = "tokenizer.ggml.tokens"
BOS_ID = "tokenizer.ggml.bos_token_id"
CHAT_TEMPLATE = "tokenizer.chat_template"

CONTEXT_LENGTH = "{arch}.context_length"
EMBEDDING_LENGTH = "{arch}.embedding_length"
BLOCK_COUNT = "{arch}.block_count"
FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
VOCAB_SIZE = "{arch}.vocab_size"
HEAD_COUNT = "{arch}.attention.head_count"
HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
KEY_LENGTH = "{arch}.attention.key_length"
VALUE_LENGTH = "{arch}.attention.value_length"
LAYERNORM_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
ROPE_DIMENSION_COUNT = "{arch}.rope.dimension_count"
ROPE_FREQ_BASE = "{arch}.rope.freq_base"

# ---------------------------------------------------------------- llama.cpp's EAGLE-3 heads
EAGLE3_ARCH = "eagle3"
EAGLE3_TARGET_LAYERS = "eagle3.target_layers"  # the three target layers whose features the head reads
EAGLE3_TARGET_HIDDEN_SIZE = "eagle3.target_hidden_size"
EAGLE3_NORM_BEFORE_RESIDUAL = "eagle3.norm_before_residual"
EAGLE3_NORM_BEFORE_FC = "eagle3.norm_before_fc"
# other llama.cpp converters' name for eagle3.target_layers (same meaning); open_head / convert translate it
EAGLE3_UPSTREAM_LAYER_KEYS = ("eagle3.extract_layers",)

# ---------------------------------------------------------------- ours (eagle2_local.*)
FEATURE_SOURCE = "eagle2_local.feature_source"  # layer_inputs (EAGLE-3's convention) or final_norm
FEATURE_LAYERS_SOURCE = "eagle2_local.feature_layers.source"
FEATURE_LAYERS_MEANING = "eagle2_local.feature_layers.meaning"
FEATURE_LAYERS_CONFIG_IDS = "eagle2_local.feature_layers.config_ids"
CHOICE = "eagle2_local.choice.{what}"  # what the converter decided on the user's behalf
SOURCE = "eagle2_local.source"
TARGET = "eagle2_local.target"
TARGET_SHA256 = "eagle2_local.target_sha256"
PROVENANCE = "eagle2_local.provenance"
TRANSLATED_FROM = "eagle2_local.translated_from"
TRANSLATED_KEYS = "eagle2_local.translated_keys"
N_TOKENS = "eagle2_local.n_tokens"  # synthetic, never in a file: the length of tokenizer.ggml.tokens
