"""baton-torch-engine: a PyTorch engine for Baton's Llama-style models, computing from the
controller's weights (its host arena, or its device copy with --device cuda) and keeping its
KV cache in the pool blocks it is granted.

`config` and `llama` are the model, computing a batched step whose rows do not depend on the
batch (`device`, `products`, `attention`, `scratch`); `kv_blocks` its KV cache; `sampler` the
reference engine's sampler; `safetensors_files` the cold-start weight reader; `main` the
engine, with its HTTP API in `server`, `requests` and `text`, its continuous batching in
`batching` and `generation`, its KV cache in the granted blocks in `pool_kv`, and the
standby's rehearsal in `rehearsal`.
"""

# Baton's version (project() in CMakeLists.txt, ../pyproject.toml): --version prints it.
__version__ = "0.1.0"
