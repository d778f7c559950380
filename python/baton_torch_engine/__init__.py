"""baton-torch-engine: a PyTorch engine for Baton's Llama-style models, computing from the
controller's weight arena and keeping its KV cache in the pool blocks it is granted.

`llama` is the model, `sampler` the reference engine's sampler, `safetensors_files` the
cold-start weight reader; `main` the engine, with its HTTP API in `server`, `requests` and
`text`, its generation loop in `generation` and its KV cache in the granted blocks in
`pool_kv`.
"""

# Baton's version (project() in CMakeLists.txt, python/pyproject.toml): --version prints it.
__version__ = "0.1.0"
