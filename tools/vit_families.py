"""Small random-init members of every branch of timm's VisionTransformer family that AttnLRP and CP-LRP support:
one table for their tests (tests/unit/test_lrp.py) and the conservation figures of their benchmark
(tools/benchmarks/lrp.py --conservation)."""

SMALL = dict(embed_dim=32, num_heads=2, depth=2, num_classes=5)

# key: (timm name, create_model kwargs)
LRP_FAMILIES = {
    "class_token": ("vit_tiny_patch16_224", dict(SMALL, img_size=32, patch_size=8)),
    "distilled": ("deit_tiny_distilled_patch16_224", dict(SMALL, img_size=32, patch_size=8)),
    "registers": ("vit_small_patch14_reg4_dinov2", dict(SMALL, img_size=28, init_values=0.5)),
    "attention_pool": ("vit_base_patch16_siglip_224", dict(SMALL, img_size=32)),
    "registers_attention_pool": ("vit_so150m_patch16_reg4_map_256", dict(SMALL, img_size=32)),
    "average_pool": ("vit_base_patch16_reg4_gap_256", dict(SMALL, img_size=32)),
    "clip_pre_norm": ("vit_base_patch16_clip_224", dict(SMALL, img_size=32)),
    "layer_scale": ("deit3_small_patch16_224", dict(SMALL, img_size=32, init_values=0.5)),
    "swiglu_rmsnorm": ("aimv2_large_patch14_224", dict(SMALL, img_size=28)),
    "res_post_norm": ("vit_base_patch16_rpn_224", dict(SMALL, img_size=32)),
    "qk_norm": ("vit_tiny_patch16_224", dict(SMALL, img_size=32, patch_size=8, qk_norm=True)),
}
