"""The teaching texts, in one place so that a teacher can read (and correct) them together.

Each text is 2-4 sentences a student can follow, with the formula where it helps. Symbols: P patch
side, N = number of patches, D token width, T = prefix tokens + N, L layers, H heads.
"""

INTRO = (
    "**ViT Lens** opens up a Vision Transformer (ViT) on an image of your choice. Pick a model and an "
    "image in the sidebar (or draw one), then walk through the numbered tabs: 1 to 8 follow the image through "
    "the network, from pixels to prediction and why; the last four are research tools. Every figure has a "
    "download button; the sidebar exports all captured arrays. The Lesson page tells the same story step by step."
)

JOB_STOPPED = ("Stopped: this page started another judge or run, which replaces this one (one at a time per page, so "
               "that the class's new images come first).")
PHONE_HINT = "Pick, upload, photograph or draw an image: open the sidebar with the » at the top left."

CANVAS_EMPTY = (
    "The canvas is empty, so the page shows the example **{example}** again. Draw on the canvas to see what "
    "the model makes of your drawing."
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

OTHER_CLASS = "other"  # the Shapes ViT's class for "none of its shapes"
OUTSIDE_SHAPES_OTHER = (
    "This teaching model only knows {count} shapes ({shapes}). To it, this image is none of them "
    "(`other`, {prob:.0%}). If it is one of them, draw it larger and clearer, or photograph it closer, "
    "straight on and evenly lit."
)
# The dashboard's own way out, after OUTSIDE_SHAPES_OTHER: the static lesson has no other model to offer.
PHOTOS_OF_THE_WORLD = "For photos of the world, choose an ImageNet model (it needs a network connection the first time)."
OUTSIDE_SHAPES_UNSURE = (
    "This teaching model only knows {count} shapes ({shapes}), and it is unsure here: its best guess, "
    "{label}, has only {prob:.0%}. If this is not one of its shapes, the answer means little."
)

UNTRAINED = (
    "RANDOM weights (untrained): the pipeline and shapes are real; its attention, filters and predictions mean nothing."
)

UPLOAD_HELP = (
    "JPEG, PNG, WebP, BMP, GIF or TIFF, up to {mb} MB. Phone photos are turned upright (EXIF), "
    "transparency is shown on white, an animation gives its first frame. The image is analysed on "
    "the server that runs this page; other users of it don't see it."
)

WHY = (
    "Attention shows where tokens look; it does not say **why** the model chose a class. The maps below "
    "each answer \"which patches made class c likely?\" in their own way, for the **target class** c you pick "
    "(the top-1 prediction unless you choose another). Each map is min-max scaled for display only."
)

METHOD_TITLES = {
    "raw_attention": "Raw attention",
    "rollout": "Rollout",
    "chefer": "Gradient x attention (Chefer)",
    "gradcam": "Grad-CAM",
    "attnlrp": "AttnLRP",
    "cplrp": "CP-LRP",
}

METHOD_TEXTS = {
    "raw_attention": "The last layer's attention of the class token to each patch, averaged over heads. "
                     "It ignores the target class: every class gets the same map.",
    "rollout": "Attention multiplied through all layers, with the skip connection counted as half of each layer "
               "(Abnar & Zuidema 2020). Also the same for every class.",
    "chefer": "Each layer's attention weighted by the gradient of the target logit $y_c$ with respect to it, "
              "negatives clipped, averaged over heads and accumulated through the layers as "
              "$R_l = R_{l-1} + \\bar A_l R_{l-1}$ (Chefer, Gur & Wolf 2021).",
    "gradcam": "The patch tokens entering the last block's attention, weighted per feature by the mean gradient "
               "of $y_c$ and summed, negatives clipped (Grad-CAM, Selvaraju et al. 2017).",
    "attnlrp": "Layer-wise relevance propagation through attention (Achtibat et al. 2024): the logit $y_c$ "
               "split back onto the input pixels layer by layer, attention included, summed per patch.",
    "cplrp": "The same propagation with the attention weights held constant (CP-LRP): relevance flows through "
             "the values only, never through the queries and keys.",
}

# The tests of the Why? tab's table: test -> (column title, what it does in a phrase a student can follow).
TEST_TITLES = {
    "deletion_auc": ("Deletion (drop)", "drop the most relevant tokens first: p(target) should fall fast"),
    "insertion_auc": ("Insertion (drop)", "keep only the most relevant tokens: p(target) should rise fast"),
    "pixel_deletion_auc": ("Deletion (mask)", "grey out the most relevant patches' pixels first"),
    "pixel_insertion_auc": ("Insertion (mask)", "grey out all but the most relevant patches"),
    "srg": ("SRG", "least-relevant-first minus most-relevant-first deletion: the gap between the two orders"),
    "saco": ("SaCo", "do patch groups the map ranks higher matter more when removed? +1 always, -1 never"),
    "pointing_game": ("Pointing game", "is the map's top patch on the object?"),
    "relevance_mass": ("Relevance mass", "share of the map's positive relevance on the object"),
    "relevance_rank": ("Rank accuracy", "share of the object's size in top patches that are object patches"),
}

WHY_DISAGREE = (
    "**Why can they disagree?** Attention weights say how much of each token's value is mixed in, not whether "
    "that value pushed the target logit up or down, and later layers and the MLPs can cancel what attention "
    "brought in. Gradient-based maps weigh what attention moved by its effect on $y_c$ (so they change with the "
    "target), but a gradient is only a local slope. **The tests judge them:** drop the patches a map calls most "
    "relevant first (deletion) and the probability of the target should fall fast; keep only those patches "
    "(insertion) and it should rise fast. A map is only called faithful on this image where it beats the same "
    "test for random patch orders by more than the random orders' own spread; the tests use different "
    "conventions, and where they disagree, no single map deserves trust."
)

FAITHFULNESS_HOW = (
    "Deletion: for k = 0..S-1 the first round(k N / S) patches of the map's order are dropped (or, masking, their "
    "pixels set to the mean); insertion: for k = 1..S only the first max(1, round(k N / S)) are kept. AUC = area under "
    "the curve (trapezoid rule). Random: the mean of 8 seeded random orders, with their spread. A map beats random on "
    "a test when it is better than the random orders' mean by more than two of their standard deviations."
)

INTERVENE = (
    "Change the input and see what the model does. **Drop** removes a patch's token from the sequence (after "
    "the position embedding is added), so the blocks never see it; **mask** sets the patch's pixels to the "
    "normalisation mean before the patch embedding, so the token is still there but carries a grey patch. "
    "**Ablating a head** sets its output (its slice of attention times values, before the output projection) "
    "to zero, or to its mean over this image's tokens. Click patches on the image to add or remove them."
)

CONCEPTS = (
    "A **concept** here is a feature of a sparse autoencoder learned from the tokens after block L of your own "
    "folder of images: each token x is rewritten as a few (k) features, $x \\approx s\\,(W_{dec} z + b_{pre}) + \\mu$, "
    "each feature a direction $d_f$ with its activation $z_f \\ge 0$. The maps show where the image's strongest "
    "features fire; beside each, the patches of the folder where it fires most. **Remove this concept** subtracts "
    "the feature's share $s\\,z_f d_f$ from every patch token after block L and runs the rest of the model: if "
    "the prediction moves, the model uses what the feature carries. Make concepts with "
    "`vit-lens concepts FOLDER --model M --layer L --out DIR`, then start the dashboard with "
    "`vit-lens dashboard --concepts DIR` to choose them here by name (the Shapes ViT's own concepts come with it)."
)

MANY_CONCEPTS = (
    "The concepts of a `vit-lens concepts` run (see the One image page's Concepts tab), over this set: **Find** "
    "runs blocks 0..L on every image of the set and ranks the features by their mean activation over the set's "
    "patch tokens; each is shown with the patches of this set where it fires most beside those of the folder it "
    "was learned from. **Remove this concept** subtracts the feature's share $s\\,z_f d_f$ from every patch token "
    "after block L of every image and says how many top-1s stay and the mean KL divergence of the class "
    "probabilities. Make concepts with `vit-lens concepts FOLDER --model M --layer L --out DIR`, then start the "
    "dashboard with `vit-lens dashboard --concepts DIR` to choose them here by name."
)

LOGIT_LENS = (
    "The **logit lens** asks what the model would predict if it stopped after block l: the tokens of that "
    "layer go through the model's own final norm, pooling and head. Row L (the last) is the real prediction. "
    "Below, the same head is applied to every patch token of one layer without pooling: each patch's top-1 "
    "class and its probability."
)

MODEL_HELP = (
    "timm Vision Transformers; pretrained weights are downloaded once (the first time can take a minute). "
    "The bundled Shapes ViT works offline."
)

MODEL_HELP_ANY = (
    "The list first, then every model of timm's ViT family (ViT, DeiT, DeiT-III, SigLIP, register models...), "
    "each also with its pretrained tags (`name.tag`): type to search. Or type a Hugging Face id as "
    "`hf-hub:owner/name` and press Enter. Pretrained weights are downloaded once (the first time can take a "
    "minute); offline, only those already in the local cache load. The bundled Shapes ViT works offline."
)

# ----------------------------------------------------------------------------------------------
# Registers & norms

REGISTERS = (
    "Every token is a vector of D numbers; its **norm** $\\|x\\| = \\sqrt{\\sum_i x_i^2}$ says how large it is. "
    "In large ViTs trained for a long time (DINOv2, OpenCLIP, DeiT-III), a few patch tokens grow norms far above "
    "all the others, from the middle layers on. Here a patch token is **high-norm** when its norm exceeds "
    "$Q_3 + 3\\,\\mathrm{IQR}$ of the patch norms of the same layer (Tukey's far-out fence, a purely statistical "
    "rule): the map frames them in green, and the histogram beside it shows why each one is marked."
)
REGISTERS_WHY = (
    "**Why do such tokens appear?** Darcet et al. found that large, long-trained ViTs recycle patches whose own "
    "content is redundant, mostly uniform background, as **global scratch space**: the token stops describing "
    "its patch and stores information about the whole image instead. These tokens have a high norm, keep "
    "little local information (their position and pixels are hard to read back from them), and absorb a large "
    "share of the attention, which shows up as bright spots on the background of attention maps. "
    "**Registers** are the fix: a few extra learnable tokens put in front of the patches like the class token, "
    "and dropped at the output. The model uses them as its scratch space instead, so the high-norm patches and "
    "the artefacts in the attention maps go away (and dense tasks such as object discovery improve). "
    "Small or briefly trained models, and untrained ones, usually show no such tokens: a few patches may "
    "still cross the fence by chance.\n\n"
    "Reference: T. Darcet, M. Oquab, J. Mairal, P. Bojanowski, *Vision Transformers Need Registers*, "
    "ICLR 2024 ([arXiv:2309.16588](https://arxiv.org/abs/2309.16588))."
)
NO_REGISTERS = (
    "**This model has no registers** ({prefix}). High-norm patches may still appear: they are the tokens that "
    "registers were invented to take over."
)
HAS_REGISTERS = (
    "**This model has {count} register token(s)** ({names}). In a trained register model the registers carry the "
    "high norms and few or no patches are marked; compare their norms with the patches' in the histogram."
)

RATE_NOTE = (
    "In the large models Darcet et al. studied, about 2% of the patch tokens are high-norm, in the later layers and "
    "mostly on background. Marks at the embeddings, or many more marks, usually just follow the picture: a plain "
    "background gives many nearly equal norms, so every patch with an edge crosses the fence."
)

# ----------------------------------------------------------------------------------------------
# The Many images page

MANY_INTRO = (
    "Run the model chosen in the sidebar over **many images** at once. For each image, each layer and each "
    "head, the **mean attention distance** is how far (in pixels of the input) a patch looks on average: the "
    "attention weights times the distance between the query patch and each key patch. Averaged over the set, "
    "it gives the paper's Fig. 7 (right): in the first layers some heads attend **locally** (small distance, "
    "like a CNN's small filters) while others already look **globally** across the image; deeper, nearly all "
    "heads look far. Every value is computed on each image, then averaged over the images (with its spread)."
)
MANY_FIGURE = (
    "One dot per head, one column per block (0 = the first): the dot is the mean over the images, its bar the "
    "standard deviation over the images. A head that spreads its attention evenly over all patches sits near "
    "the dashed line; a head that looks only at its own neighbourhood sits low."
)
MANY_LENS = (
    "**Logit lens**: the model's own final norm and classifier head applied to the tokens after each block, as "
    "if the network stopped there. Its top-1 accuracy per layer shows at which depth the answer becomes readable."
)
MANY_HIGH_NORM = (
    "**High-norm tokens** (Darcet et al., 2024): the share of patch tokens whose norm is far above the others "
    "in that layer (above Q3 + 3 IQR of the layer's patch norms). Large trained ViTs grow a few of them in "
    "the later layers, used as scratch space; models with register tokens grow fewer."
)
