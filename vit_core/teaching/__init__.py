"""The bundled offline teaching model, "Shapes ViT".

- `model`: registers it with timm (`SHAPES_VIT_TIMM_NAME`) and holds the one loader of a model directory
  (`load_shapes_vit`);
- `data`: the procedural shapes dataset (images, object masks, labels) the model is trained on;
- `train`: builds it through its timm registration and trains it (`python -m vit_core.teaching.train`);
- `evaluate`: measures accuracy and learned structure and writes metrics.json and MODEL_CARD.md
  (`python -m vit_core.teaching.evaluate vit_core/assets/shapes_vit`).

The trained files live in `vit_core/assets/shapes_vit/`.
"""
