"""The flagship: sentence embeddings of every row of Parquet, JSON lines or the built-in corpus.

One route for every input, each step a module::

    flags.py       the job's flags, and Beam's, checked before anything runs
    parts.py       the run's input files, its parts, a row's key (file, row)
    plan.py        at launch: buckets or packed rows, planned from a sample of the input
    read.py        files -> Arrow record batches, one per part (file, row range)
                    (Parquet, JSON lines: beam_jax.ReadArrowBatches; the built-in corpus)
                   -> Reshuffle (spread the parts over the workers)
    embed_parts.py -> one step per part (the accelerator's, if any):
                      one tokenizer call per part (beam_jax.text.TokenizeBatches)
                      -> beam_jax.RunKernelOnArrow (MiniLM in JAX, bucketed or packed)
    write.py          -> the part written once all its rows have a result or a dead letter
    job.py         the graph above, the run: resume, staged publishing, threshold, summary

Run it with ``python -m pipelines.embed`` (``beam-jax embed``); see docs/embed_text.md.
"""
