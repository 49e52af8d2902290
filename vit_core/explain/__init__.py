"""Why this prediction: relevance maps, the logit lens, interventions and the faithfulness test.

Definitions: docs/spec/analyses.md, "Why this prediction". One module per family of method:

- `relevance`: raw attention, rollout, Chefer's gradient-weighted relevance and Grad-CAM (`relevance_maps`);
- `lens`: the logit lens, per block and per patch (`logit_lens`, `patch_logit_lens`);
- `interventions`: dropped or masked patches and ablated heads (`predict_intervened`);
- `perturbation`: the faithfulness test, deletion and insertion curves against a random baseline (`faithfulness`);
- `passes`: what they share (the target class, the model input, a locked float32 pass of the shared model).

Pure definitions on numpy arrays sit beside the entry points that run the model; every name below is
reachable as `vit_core.explain.NAME`.
"""

from .interventions import (
    Ablation,
    embedded_tokens,
    heads_ablated,
    keep_tokens,
    mask_patches,
    predict_intervened,
    run_from_embedded,
)
from .lens import head_logits, logit_lens, patch_logit_lens
from .passes import InterventionError, TargetError, eval_mode, model_input, model_pass, parameters_frozen, resolve_target
from .perturbation import (
    DEFAULT_STEPS,
    RANDOM,
    RANDOM_ORDERS,
    Faithfulness,
    MethodCurves,
    auc,
    deletion_counts,
    deletion_x,
    faithfulness,
    faithfulness_by_method,
    faithfulness_of,
    insertion_counts,
    insertion_x,
    patch_order,
    random_patch_orders,
)
from .relevance import (
    ATTNLRP_UNSUPPORTED,
    METHODS,
    Relevance,
    chefer_map,
    class_token_row,
    gradcam_map,
    raw_attention_map,
    relevance_maps,
    rollout_map,
    token_norms,
)

__all__ = [
    "ATTNLRP_UNSUPPORTED", "Ablation", "DEFAULT_STEPS", "Faithfulness", "InterventionError", "METHODS", "MethodCurves",
    "RANDOM", "RANDOM_ORDERS", "Relevance", "TargetError", "auc", "chefer_map", "class_token_row", "deletion_counts",
    "deletion_x", "embedded_tokens", "eval_mode", "faithfulness", "faithfulness_by_method", "faithfulness_of",
    "gradcam_map", "head_logits", "heads_ablated", "insertion_counts", "insertion_x", "keep_tokens", "logit_lens",
    "mask_patches", "model_input", "model_pass", "parameters_frozen", "patch_logit_lens", "patch_order",
    "predict_intervened", "random_patch_orders", "raw_attention_map", "relevance_maps", "resolve_target",
    "rollout_map", "run_from_embedded", "token_norms",
]
