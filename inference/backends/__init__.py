"""Generator backends (transformers, vLLM, OpenAI-compatible). Imports only `reasoning`."""
