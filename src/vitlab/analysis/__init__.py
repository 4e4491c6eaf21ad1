"""Looking inside a ViT the way the paper does (Sec. 4.5, Fig. 6-7) and its few-shot probe (Sec. 4.1).

Every function returns numpy arrays, so you can plot your own way. On top of them: `findings` (everything a
report shows, and the paper's statements measured), `plots` (the paper's figures as matplotlib Figures, backend
untouched), `page` and `report` (the PNG/JSON/HTML report); `vitlab analyze` / `vitlab fewshot` wrap it all on
the command line. The model is read through its public API only (`embed`, `blocks`, `forward_head`, ...).
"""

from .attention import (
    AttentionAnalysis,
    BatchReduction,
    analyze_attention,
    attention_rollout,
    iter_attention,
    iter_blocks,
    mean_attention_distance,
    patch_distances,
    reduce_batch,
    rollout_step,
    token_maps,
    upsample_maps,
)
from .fewshot import FewShotResult, RidgeClassifier, draw_shots, extract_features, fewshot_evaluate, fit_ridge
from .filters import FilterPCA, components_to_images, filter_pca, patch_embedding_filters
from .inputs import (
    analysis_preprocess,
    check_image_size,
    expand_image_paths,
    load_checkpoint,
    load_inputs,
    split_features,
)
from .posembed_sim import pos_embed_similarity, position_embedding_grid, similarity_by_distance
from .tokens import TokenStats, layer_token_stats, token_layout

__all__ = [
    "AttentionAnalysis",
    "BatchReduction",
    "FewShotResult",
    "FilterPCA",
    "RidgeClassifier",
    "TokenStats",
    "analysis_preprocess",
    "analyze_attention",
    "attention_rollout",
    "check_image_size",
    "components_to_images",
    "draw_shots",
    "expand_image_paths",
    "extract_features",
    "fewshot_evaluate",
    "filter_pca",
    "fit_ridge",
    "iter_attention",
    "iter_blocks",
    "layer_token_stats",
    "load_checkpoint",
    "load_inputs",
    "mean_attention_distance",
    "patch_distances",
    "patch_embedding_filters",
    "pos_embed_similarity",
    "position_embedding_grid",
    "reduce_batch",
    "rollout_step",
    "similarity_by_distance",
    "split_features",
    "token_layout",
    "token_maps",
    "upsample_maps",
]
