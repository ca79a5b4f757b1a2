"""The toy world and its base model (docs/toy_world.md).

The world library: ``world`` (arithmetic), ``forking`` (one strategy choice per problem) and ``worlds`` (the
``toy.world`` dispatch, the only module the data stage imports, for its rows and benchmarks), and ``tokenizer``.
The base stage (``python -m toy.base``): ``pretrain`` trains the tiny Qwen3 on the world's documents, ``entropy``
measures a toy model on its own samples.
"""
