"""What the pipelines register with the ``beam-jax`` command (entry points in pyproject.toml).

Light on purpose: ``beam-jax --help`` reads the pipelines' one-line help from here without
importing JAX or Beam. (``--kernel minilm`` and ``--tokenizer minilm`` need no entry point:
``beam_jax.text`` provides them.)
"""

# (module whose main(argv) runs the pipeline, one-line help)
EMBED = ("pipelines.embed", "sentence embeddings (MiniLM in JAX) of a text column")
CURATE = ("pipelines.curate", "find mislabelled records by per-record gradient scores")
