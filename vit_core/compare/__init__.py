"""Two models side by side over one set of images (`vit-lens compare`; docs/spec/analyses.md, "Two models";
docs/spec/interface.md, "Two models").

- `measures`: the comparisons as pure functions (linear CKA from sums, attention JS, KL, Pearson), numpy and torch;
- `sums`: exact, mergeable sums of the comparison (CKA's cross products, JS moments, the per-image rows);
- `engine`: each image decoded once, each model's forward reduced by dataset's `reduce_batch` (so DIR/a, DIR/b are
  `dataset`'s files bit for bit) with the comparison recorded in the same forwards; the parts on disk (dataset's
  PartStore);
- `runs`: a folder's run: plans, manifests, shards to do, the files at the end;
- `ray_engine`: the shards on Ray Data (`--engine ray`), the same bytes as in one process;
- `files`: compare.csv, compare.npz, compare.json, compare.png;
- `concepts`: `--concepts-layer`'s one dictionary on both models' tokens, each feature's share from A, DIR/concepts.
"""

from .engine import (
           Comparable,
           CompareStore,
           Explain,
           Pair,
           comparable,
           reduce_pairs,
           reduce_sources_pair,
           run_pair_shards,
           with_names_of,
)
from .files import compare_files
from .measures import attention_js, linear_cka, pearson, prediction_kl
from .runs import CompareRun, compare_sources, finished, plan_compare, todo_of, write_files
from .sums import CompareTotals, FixedSums

__all__ = ["Comparable", "CompareRun", "CompareStore", "CompareTotals", "Explain", "FixedSums", "Pair", "attention_js",
           "comparable", "compare_files", "compare_sources", "finished", "linear_cka", "pearson", "plan_compare", "prediction_kl",
           "reduce_pairs", "reduce_sources_pair", "run_pair_shards", "todo_of", "with_names_of", "write_files"]
