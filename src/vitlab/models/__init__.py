"""The networks and what fixes them, with no weights readers (those build on this: `vitlab.weights`).

    config       ViTConfig and the table of named variants (paper Table 1, DeiT / AugReg Ti and S); torch-free
    vit          the Vision Transformer, Eq. 1-4 of the paper
    posembed     learned / sin-cos 2-D position embeddings and their 2-D resampling
    hybrid       the BiT ResNet stem of the hybrid (GroupNorm + weight-standardised convolutions)
    resnet       BiT ResNet-v2, the paper's CNN baseline, and `config_from_name` for either family
    layers       the few pieces both networks share (input checks, zero-initialised heads)
    flops        parameter and FLOP counts without building a model (Table 1, Fig. 5)
    preprocess   `Preprocess`: the input contract of a set of weights (size, crop, mean / std); torch-free

Build a model with `vitlab.create_model(name, weights=...)` (`vitlab.weights.factory`).
"""
