"""The analyses over many images: a folder (or a set of uploads) reduced on the model's device, in shards that merge.

Definitions: docs/spec/analyses.md, "Over many images": dataset values are means over images of the per-image
values (and their spread), never values of a mean image. Formats: docs/spec/interface.md, "Many images".

- `listing`: a folder's images, the files that are not images (with the reason), labels from class-named
  subfolders, shards (contiguous slices of the sorted images);
- `reductions`: decoding, and hooked forwards reduced on the device to per-image values (and with lenses, their
  arrays read on the same forwards);
- `workers`: on a CPU, W forwards at once, each on its own thread at one torch thread, on copies of the model's
  modules that share its weights;
- `totals`: what a set of images adds up to (counts, exact sums, the per-image rows), mergeable;
- `analyze`: the loop in this process, `analyze_dataset`, and `explained_values`, the one function that says what
  `--explain` adds per image;
- `result`: the dataset-level result and its files (dataset.npz, dataset.json, the figure, the tables);
- `runs`: a folder's run cut into shards, each written as a part beside a manifest: resumable, mergeable;
- `ray_engine`: the same run on Ray Data (optional: `pip install "vit-lens[ray]"`);
- `progress`: progress lines for a log when the output is not a terminal.
"""

from .analyze import (
    DatasetError,
    MaskFolder,
    MasksByName,
    analyze_dataset,
    analyze_totals,
    check_labels,
    class_names,
    consecutive_batches,
    dataset_result,
    explained_values,
    reduce_sources,
)
from .listing import (
    Shard,
    ShardError,
    class_of_folder,
    folder_labels,
    is_image_path,
    list_images,
    list_not_images,
    not_image_reason,
    parse_shard,
    shards,
)
from .reductions import (
    BatchValues,
    DecodedImages,
    LensedImage,
    Source,
    attention_distances,
    collate_decoded,
    decoded_crop,
    default_batch_size,
    forward_images,
    high_norm_rates,
    image_loader,
    patch_distances_on,
    reduce_batch,
    reductions_recorded,
    token_norms,
)
from .result import (
    LAYERS,
    TABLE_FORMATS,
    DatasetResult,
    class_table,
    csv_bytes,
    dataset_files,
    image_table,
    merge_results,
    result_of,
)
from .runs import PartsError, PartStore, RunPlan, manifest_of, merged_result, plan_run, run_shards
from .totals import NO_LABEL, ExactMoments, ImageRows, Totals
from .workers import ForwardPool, forward_pool, model_workers, pool_width

__all__ = [
    "LAYERS", "NO_LABEL", "TABLE_FORMATS", "BatchValues", "DatasetError", "DatasetResult", "DecodedImages", "ImageRows",
    "MaskFolder", "MasksByName",
    "PartStore", "PartsError",
    "ForwardPool", "LensedImage", "forward_pool", "model_workers", "pool_width",
    "RunPlan", "ExactMoments", "Shard", "ShardError", "Source", "Totals",
    "analyze_dataset", "analyze_totals", "attention_distances", "check_labels", "class_names", "class_of_folder", "class_table",
    "collate_decoded", "consecutive_batches", "csv_bytes", "dataset_files", "dataset_result", "decoded_crop",
    "default_batch_size", "explained_values", "forward_images", "folder_labels", "high_norm_rates", "image_loader", "image_table",
    "is_image_path", "list_images", "list_not_images", "manifest_of", "merge_results", "merged_result",
    "not_image_reason", "parse_shard", "patch_distances_on", "plan_run", "reduce_batch", "reduce_sources",
    "reductions_recorded", "result_of", "run_shards", "shards", "token_norms",
]
