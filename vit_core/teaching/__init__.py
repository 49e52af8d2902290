"""The bundled offline teaching model, "Shapes ViT".

- `data`: the procedural shapes dataset (images, object masks, labels) the model is trained on;
- `train`: builds the plain timm VisionTransformer and trains it on CPU (`python -m vit_core.teaching.train`);
- `evaluate`: measures accuracy and learned structure and writes metrics.json and MODEL_CARD.md
  (`python -m vit_core.teaching.evaluate vit_core/assets/shapes_vit`).

The trained files live in `vit_core/assets/shapes_vit/`.
"""
