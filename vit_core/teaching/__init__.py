"""The bundled offline teaching model, "Shapes ViT".

- `model`: registers it with timm (`SHAPES_VIT_TIMM_NAME`) and holds the one loader of a model directory
  (`load_shapes_vit`);
- `data`: the procedural shapes dataset (images, object masks, labels) the model is trained on.

The trained files live in `vit_core/assets/shapes_vit/`. Training and evaluation are tools, not part of the
package: tools/teaching/ (`python -m tools.teaching.train`, `python -m tools.teaching.evaluate`).
"""
