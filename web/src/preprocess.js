// The model's eval transform in the browser, as timm builds it (timm.data.create_transform, is_training=False) and
// as vit_core.loading.model runs it on a PIL image: Resize (Pillow's resampling, reproduced to the bit below), then
// CenterCrop, ToTensor and Normalize. Pure functions of RGB pixel arrays: (H, W, 3) uint8 row-major.

const PRECISION_BITS = 32 - 8 - 2; // Pillow's fixed-point coefficients for 8-bit images (Resample.c)

const FILTERS = {
  bilinear: { support: 1, f: (x) => { x = Math.abs(x); return x < 1 ? 1 - x : 0; } },
  bicubic: {
    support: 2,
    f: (x) => {
      const a = -0.5; // Pillow's bicubic
      x = Math.abs(x);
      if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
      if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
      return 0;
    },
  },
  box: { support: 0.5, f: (x) => (x > -0.5 && x <= 0.5 ? 1 : 0) },
};

/** Pillow's precompute_coeffs + normalize_coeffs_8bpc: per output pixel its first input pixel, count, and integer
 * weights. */
function coefficients(inSize, outSize, filter) {
  const scale = inSize / outSize, filterScale = Math.max(scale, 1);
  const support = filter.support * filterScale, ss = 1 / filterScale;
  const out = [];
  for (let xx = 0; xx < outSize; xx++) {
    const center = (xx + 0.5) * scale;
    const xmin = Math.max(Math.trunc(center - support + 0.5), 0);
    const xmax = Math.min(Math.trunc(center + support + 0.5), inSize) - xmin;
    const w = [];
    let total = 0;
    for (let x = 0; x < xmax; x++) {
      const v = filter.f((x + xmin - center + 0.5) * ss);
      w.push(v);
      total += v;
    }
    const k = w.map((v) => (total !== 0 ? v / total : v))
      .map((v) => (v < 0 ? Math.trunc(-0.5 + v * 2 ** PRECISION_BITS) : Math.trunc(0.5 + v * 2 ** PRECISION_BITS)));
    out.push({ min: xmin, k });
  }
  return out;
}

function clip8(sum) {
  return Math.min(255, Math.max(0, Math.floor(sum / 2 ** PRECISION_BITS)));
}

/** Pillow's Image.resize(size, resample) of an RGB image: horizontal pass first (over the rows the vertical pass
 * reads), then vertical, each rounded to 8 bits. pixels (h, w, 3) -> (outH, outW, 3). */
export function resizeLikePillow(pixels, w, h, outW, outH, interpolation) {
  if (outW === w && outH === h) return Uint8ClampedArray.from(pixels);
  const filter = FILTERS[interpolation] || FILTERS.bilinear;
  let src = pixels, sw = w;
  const vertical = coefficients(h, outH, filter);
  const first = vertical[0].min, last = vertical[outH - 1].min + vertical[outH - 1].k.length;
  if (outW !== w) {
    const horizontal = coefficients(w, outW, filter);
    const rows = last - first, tmp = new Uint8ClampedArray(rows * outW * 3);
    for (let y = 0; y < rows; y++) {
      for (let xx = 0; xx < outW; xx++) {
        const { min, k } = horizontal[xx];
        for (let c = 0; c < 3; c++) {
          let sum = 2 ** (PRECISION_BITS - 1);
          for (let x = 0; x < k.length; x++) sum += src[((y + first) * sw + x + min) * 3 + c] * k[x];
          tmp[(y * outW + xx) * 3 + c] = clip8(sum);
        }
      }
    }
    src = tmp; sw = outW;
    for (const v of vertical) v.min -= first; // the temporary image starts at the first row the vertical pass reads
  }
  if (outH === h) return src;
  const out = new Uint8ClampedArray(outH * sw * 3);
  for (let yy = 0; yy < outH; yy++) {
    const { min, k } = vertical[yy];
    for (let x = 0; x < sw; x++) {
      for (let c = 0; c < 3; c++) {
        let sum = 2 ** (PRECISION_BITS - 1);
        for (let y = 0; y < k.length; y++) sum += src[((y + min) * sw + x) * 3 + c] * k[y];
        out[(yy * sw + x) * 3 + c] = clip8(sum);
      }
    }
  }
  return out;
}

/** Python's round() (halves to even), for torchvision's centre crop offsets. */
function roundHalfEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** (width, height) timm's eval transform resizes a picture of (w, h) to before its crop (resized_size in
 * vit_core.loading.model; torchvision's Resize(int): the shorter side to the scale, the longer int(scale * long / short)). */
export function resizedSize(pre, w, h) {
  const [, height, width] = pre.input_size;
  const scaleH = Math.floor(height / pre.crop_pct), scaleW = Math.floor(width / pre.crop_pct);
  if (pre.crop_mode === "squash") return [scaleW, scaleH];
  if (pre.crop_mode === "border") {
    const ratio = Math.max(h / scaleH, w / scaleW);
    return [Math.round(w / ratio), Math.round(h / ratio)];
  }
  if (scaleH === scaleW) return w <= h ? [scaleW, Math.trunc((scaleW * h) / w)] : [Math.trunc((scaleH * w) / h), scaleH];
  const ratio = Math.min(h / scaleH, w / scaleW);
  return [Math.round(w / ratio), Math.round(h / ratio)];
}

/** The crop the model sees: RGB (h, w, 3) -> {crop: (H, W, 3) uint8, width, height}. */
export function modelCrop(pixels, w, h, pre) {
  const [rw, rh] = resizedSize(pre, w, h);
  const resized = resizeLikePillow(pixels, w, h, rw, rh, pre.interpolation);
  const [, H, W] = pre.input_size;
  const top = roundHalfEven((rh - H) / 2), left = roundHalfEven((rw - W) / 2);
  const crop = new Uint8ClampedArray(H * W * 3);
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      for (let c = 0; c < 3; c++) crop[(y * W + x) * 3 + c] = resized[((y + top) * rw + x + left) * 3 + c];
    }
  }
  return { crop, width: W, height: H };
}

/** ToTensor and Normalize in float32, as torch computes them: crop (H, W, 3) -> Float32Array (3, H, W). */
export function normalised(crop, width, height, pre) {
  const out = new Float32Array(3 * height * width);
  const f = Math.fround;
  for (let c = 0; c < 3; c++) {
    const mean = f(pre.mean[c]), std = f(pre.std[c]);
    for (let i = 0; i < height * width; i++) out[c * height * width + i] = f(f(f(crop[i * 3 + c] / 255) - mean) / std);
  }
  return out;
}

/** RGBA pixels (a canvas's or a decoded image's) composited on white, as vit_core.images.to_rgb does: (h*w*4) -> (h*w*3). */
export function rgbOnWhite(rgba) {
  const n = rgba.length / 4, out = new Uint8ClampedArray(n * 3);
  for (let i = 0; i < n; i++) {
    const a = rgba[i * 4 + 3];
    for (let c = 0; c < 3; c++) {
      const v = rgba[i * 4 + c];
      out[i * 3 + c] = a === 255 ? v : Math.round((v * a + 255 * (255 - a)) / 255);
    }
  }
  return out;
}
