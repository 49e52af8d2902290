"""The Shapes ViT's making, outside the package (vit_core.teaching keeps the generator and the model):

- `train`: builds it through its timm registration and trains it (`python -m tools.teaching.train`);
- `evaluate`: measures accuracy and learned structure and writes metrics.json and MODEL_CARD.md
  (`python -m tools.teaching.evaluate vit_core/assets/shapes_vit`);
- `second_drawer`, `page_photos`: independent held-out images (never trained on) that `evaluate` and the
  tests check the model on;
- `teaching_quick_eval`, `teaching_sweep.sh`: quick figures of training runs, and recipe variants compared
  on a GPU.

Run them from the repository root."""
