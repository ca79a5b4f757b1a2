"""The toy world and its base model (docs/toy_world.md).

The world library: two worlds, ``arithmetic`` (sums of products in four solution styles) and ``forking`` (one
strategy choice per problem); ``worlds``, the ``toy.world`` dispatch between them (the only module the data stage
imports, for its rows and benchmarks); and ``tokenizer``.
The base stage (``python -m toy.base``): ``pretrain`` trains the tiny Qwen3 on the world's documents, ``entropy``
measures a toy model on its own samples.
"""
