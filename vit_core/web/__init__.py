"""The lesson without a server: `vit-lens export-web` writes a static site whose model runs in each student's browser.

- `graph`: the model as ONNX graphs with the interventions as inputs (the kept patches, a head mask), exported from
  the same timm module `run_with_capture` runs: one with the lesson's outputs (logits, every layer's attention, the
  logit lens, token norms), one with the logits alone for the perturbation tests, their weights in one shared file;
- `site`: the folder a static host serves: index.html and the page's modules (from the checkout's web/), the graphs,
  the weight-only figure data, the examples, and ONNX Runtime Web's own files from its npm package.

The page computes every per-image figure itself (web/src/); nothing here imports the dashboard.
"""
