"""Why this prediction: relevance maps, the logit lens, interventions and the faithfulness test.

Definitions: docs/spec/analyses.md, "Why this prediction". One module per family of method:

- `relevance`: raw attention, rollout, Chefer's gradient-weighted relevance, Grad-CAM, AttnLRP and CP-LRP
  (`relevance_maps`); `lrp`: AttnLRP and CP-LRP's rules and the input relevance (`input_relevance`);
- `lens`: the logit lens, per block and per patch (`logit_lens`, `patch_logit_lens`);
- `interventions`: dropped or masked patches and ablated heads (`predict_intervened`);
- `perturbation`: the faithfulness test, deletion and insertion curves against a random baseline (`faithfulness`),
  and the verdict rule with its margin (`verdict`);
- `evaluation`: which map to trust on an image: every test beside its random baseline in one table (`judge`), SRG and
  SaCo, and over a folder (`folder_judgement`); `localisation`: the metrics against an object mask (`object_patches`);
  `sanity`: Adebayo et al.'s randomisation checks (`sanity_checks`); `ranks`: Spearman and Kendall;
- `passes`: what they share (the target class, the model input, a locked float32 pass of the shared model, and
  `between_batches`, the one hook a caller sharing the model has into long runs of forwards).

Pure definitions on numpy arrays sit beside the entry points that run the model; every name below is
reachable as `vit_core.explain.NAME`.
"""

from .evaluation import (
    CONVENTIONS,
    FAITHFULNESS_TESTS,
    SACO_GROUPS,
    TESTS,
    FolderJudgement,
    Judgement,
    TestResult,
    folder_judgement,
    judge,
    judgement_scalars,
    mean_scalars,
    rank_map,
    saco,
    saco_groups,
    saco_of,
    saco_scores,
    srg,
    summarise,
)
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
from .localisation import (
    LOCALISATION_METRICS,
    MaskError,
    binary_mask,
    crop_mask,
    localisation,
    mask_from_file,
    object_patches,
    patch_fraction,
    pointing_game,
    random_localisation,
    relevance_mass,
    relevance_rank,
)
from .lrp import (
    EPSILON,
    EPSILON_ONLY,
    LRP_METHODS,
    GammaChoice,
    InputRelevance,
    LrpChoice,
    LrpError,
    choose_per_method,
    gamma_candidates,
    input_relevance,
    patch_relevance,
    pick_choice,
    why_unsupported,
)
from .passes import (
    InterventionError,
    TargetError,
    between_batches,
    eval_mode,
    forward_lanes,
    forwards_on_lanes,
    model_input,
    model_pass,
    parameters_frozen,
    resolve_target,
)
from .perturbation import (
    DEFAULT_STEPS,
    MARGIN_SDS,
    PERTURBATIONS,
    RANDOM,
    RANDOM_ORDERS,
    Faithfulness,
    KeptSetProbs,
    KnownSets,
    MethodCurves,
    Verdict,
    auc,
    deletion_counts,
    deletion_kept,
    deletion_x,
    faithfulness,
    faithfulness_of,
    insertion_counts,
    insertion_kept,
    insertion_x,
    lerf_kept,
    patch_order,
    random_patch_orders,
    verdict,
)
from .ranks import average_ranks, kendall_tau_b, spearman
from .relevance import (
    LRP_CHOICE_STEPS,
    METHODS,
    Relevance,
    chefer_map,
    class_token_row,
    faithfulness_scorer,
    gradcam_map,
    raw_attention_map,
    relevance_maps,
    rollout_map,
    token_norms,
)
from .sanity import Sanity, cascading_randomisation, class_randomisation, method_maps, randomisation_stages, sanity_checks

__all__ = [
    "Ablation", "DEFAULT_STEPS", "Faithfulness", "InterventionError", "METHODS", "MethodCurves",
    "RANDOM", "RANDOM_ORDERS", "Relevance", "TargetError", "auc", "chefer_map", "class_token_row", "deletion_counts",
    "between_batches", "deletion_x", "embedded_tokens", "eval_mode", "faithfulness", "faithfulness_of",
    "gradcam_map", "head_logits", "heads_ablated", "insertion_counts", "insertion_x", "keep_tokens", "logit_lens",
    "forward_lanes", "forwards_on_lanes", "mask_patches", "model_input", "model_pass", "parameters_frozen",
    "patch_logit_lens", "patch_order",
    "predict_intervened", "random_patch_orders", "raw_attention_map", "relevance_maps", "resolve_target",
    "rollout_map", "run_from_embedded", "token_norms",
    # evaluation: faithfulness tests, localisation, sanity checks, the trust table
    "CONVENTIONS", "FAITHFULNESS_TESTS", "LOCALISATION_METRICS", "MARGIN_SDS", "PERTURBATIONS", "SACO_GROUPS", "TESTS",
    "FolderJudgement", "Judgement", "KeptSetProbs", "KnownSets", "MaskError", "Sanity", "TestResult", "Verdict", "average_ranks",
    "binary_mask", "cascading_randomisation", "class_randomisation", "crop_mask", "deletion_kept", "folder_judgement",
    "insertion_kept", "judge", "judgement_scalars", "kendall_tau_b", "lerf_kept", "localisation", "mask_from_file",
    "mean_scalars", "method_maps", "object_patches", "patch_fraction", "pointing_game", "random_localisation",
    "randomisation_stages", "rank_map", "relevance_mass", "relevance_rank", "saco", "saco_groups", "saco_of", "saco_scores",
    "sanity_checks", "spearman", "srg", "summarise", "verdict",
    # AttnLRP and CP-LRP
    "EPSILON", "EPSILON_ONLY", "LRP_CHOICE_STEPS", "LRP_METHODS", "GammaChoice", "InputRelevance", "LrpChoice", "LrpError",
    "choose_per_method", "faithfulness_scorer", "gamma_candidates", "input_relevance", "patch_relevance", "pick_choice",
    "why_unsupported",
]
