"""The teaching texts, in one place so that a teacher can read (and correct) them together.

Each text is 2-4 sentences a student can follow, with the formula where it helps. Symbols: P patch
side, N = number of patches, D token width, T = prefix tokens + N, L layers, H heads.
"""

INTRO = (
    "**ViT Lens** opens up a Vision Transformer (ViT) on an image of your choice. Pick a model and an "
    "image in the sidebar, then walk through the tabs from left to right: they follow the image through "
    "the network, from pixels to prediction. Every figure has a download button; the sidebar exports all "
    "captured arrays."
)

PIPELINE = (
    "A ViT reads an image the way a language model reads a sentence. The image is resized and cropped, "
    "cut into square **patches**, and each patch is turned into a vector (a **token**) by one linear map. "
    "Prefix tokens (the class token CLS, if the model has one) are put in front and a learned **position "
    "embedding** is added. Then the same kind of **transformer block** (attention + MLP) is applied "
    "L times, and the classifier **head** reads the class token (or the mean of the patch tokens)."
)

PATCHES = (
    "The crop is cut into a grid of non-overlapping P x P patches, numbered row by row. Each patch, "
    "flattened, is a vector x_k of P·P·3 numbers. The model's first layer is written as a convolution with "
    "kernel = stride = P, but that is exactly one matrix E applied to every flattened patch: "
    "$z_k = E\\,x_k + b$, with $E$ of shape (D, P·P·3). Below, both are computed and compared."
)

FILTERS = (
    "Each row of E is a **filter**: a P x P x 3 pattern the patch is compared with (dot product). "
    "Like the paper (Fig. 7, left), we treat the D filters as D samples and show their top principal "
    "components: trained ViTs learn smooth, low-frequency bases much like a CNN's first layer. A random "
    "model's components look like noise. Colours are min-max scaled per component; the sign is arbitrary."
)

POSITIONS = (
    "The model cannot know where a patch came from, so a learned vector $p_k$ is added to patch k's token. "
    "Tile (r, c) shows the cosine similarity $\\cos(p_k, p_j) = p_k \\cdot p_j / (\\|p_k\\|\\,\\|p_j\\|)$ "
    "of patch k = (r, c) with every other patch (paper Fig. 7, center). Nearby patches get similar "
    "embeddings, and row/column structure appears: the model learned the 2D layout itself."
)

POSITIONS_RESAMPLE = (
    "At another input size the grid changes, so the embedding is resampled in 2D (bicubic interpolation of "
    "the gh x gw grid of vectors, prefix rows untouched), as timm does when fine-tuning at a higher resolution."
)

NO_POS_EMBED = (
    "This model has no learned absolute position embedding (it encodes position another way, e.g. "
    "rotary or relative position), so there is nothing to show here."
)

ATTENTION = (
    "In each head, every token (a **query**) computes weights over all tokens (the **keys**): "
    "$A = \\mathrm{softmax}(Q K^\\top / \\sqrt{d})$, one row per query, each row summing to 1. Click a patch "
    "on the image (or choose CLS) to see where that token looks in the chosen layer and head. Part of "
    "each row goes to the prefix tokens rather than to patches: its share is shown beside the map."
)

ROLLOUT = (
    "**Attention rollout** (Abnar & Zuidema 2020; paper Fig. 6) follows attention through all layers: "
    "per layer fuse the heads, add the skip connection as $A_l = 0.5\\,\\bar A_l + 0.5\\,I$ (rows "
    "renormalised), and multiply $R = A_L \\cdots A_1$. The class token's row of R says how much each "
    "patch contributed to it (for models without one, the mean of the patch rows)."
)

DISTANCE = (
    "How far does a head look? For head h of layer l, the **mean attention distance** is "
    "$\\frac{1}{N}\\sum_i \\sum_j A_{ij}\\, d(i,j)$: the pixel distance between query patch i and key "
    "patch j, weighted by attention (paper Fig. 7, right). Some early heads already look far across the "
    "image while others stay local; deeper layers look far. The dashed line is what attention spread "
    "evenly over all patches would give."
)

DISTANCE_CONVENTION = (
    "Default convention: the attention a patch gives to prefix tokens is left out (not renormalised). "
    "'Renormalise' first rescales each patch row over patch keys to sum to 1."
)

PREDICTION = (
    "The head is one linear layer: logits $= W\\,h + b$, one number per class, from the final class token "
    "(or pooled patch tokens) h. Softmax turns them into probabilities: $p_c = e^{z_c} / \\sum_j e^{z_j}$."
)

UNTRAINED = (
    "This model has RANDOM weights (untrained): the pipeline and shapes are real, but its attention, "
    "filters and predictions carry no meaning."
)

UPLOAD_HELP = (
    "JPEG, PNG, WebP, BMP, GIF or TIFF, up to {mb} MB. Phone photos are turned upright (EXIF), "
    "transparency is shown on white, an animation gives its first frame. The image is analysed on "
    "the server that runs this page; other users of it don't see it."
)
