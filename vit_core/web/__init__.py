"""The lesson without a server: `vit-lens export-web` writes a static site whose model runs in each student's browser.

- `graph`: the model as one ONNX graph with the lesson's outputs (logits, every layer's attention, the logit lens,
  token norms) and the interventions as inputs (a patch keep-mask, a head mask), exported from the same timm module
  `run_with_capture` runs;
- `site`: the folder a static host serves: index.html and the page's modules (from the checkout's web/), model.onnx,
  the weight-only figure data, the examples, and ONNX Runtime Web's own files from its npm package.

The page computes every per-image figure itself (web/src/); nothing here imports the dashboard.
"""
