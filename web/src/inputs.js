// The student's image: an example, a photo (a file input; phones offer their camera) or a drawing, as RGB pixels.

import { rgbOnWhite } from "./preprocess.js";

// As the server (vit_core.images): refuse past 50 MP or a side 1000 times the other, read from the header before any
// pixel is decoded; above SCALE_ABOVE pixels decode at a reduced size (a 20000 x 20000 PNG decoded whole is 1.6 GB of
// pixels in the student's tab). A 12 MP phone photo is decoded whole, as the library decodes it.
export const MAX_PIXELS = 50_000_000, MAX_SIDE_RATIO = 1000, SCALE_ABOVE = 16_000_000, SCALED_PIXELS = 4_000_000;

/** Refused before decoding: `message` is the one sentence the page shows. */
export class ImageRefusal extends Error {}

const u16be = (b, i) => (b[i] << 8) | b[i + 1], u16le = (b, i) => b[i] | (b[i + 1] << 8);
const u32be = (b, i) => ((b[i] << 24) >>> 0) + (b[i + 1] << 16) + (b[i + 2] << 8) + b[i + 3];
const u32le = (b, i) => ((b[i + 3] << 24) >>> 0) + (b[i + 2] << 16) + (b[i + 1] << 8) + b[i];

/** An image file's width and height from its header (PNG, JPEG, GIF, WebP, BMP), or null: bytes is its start
 * (a JPEG's frame header may come after its EXIF block, so pass the first 256 KB or more). */
export function imageSize(b) {
  if (b.length >= 24 && u32be(b, 0) === 0x89504e47 && u32be(b, 12) === 0x49484452) return { width: u32be(b, 16), height: u32be(b, 20) };
  if (b.length >= 10 && b[0] === 0x47 && b[1] === 0x49 && b[2] === 0x46) return { width: u16le(b, 6), height: u16le(b, 8) };
  if (b.length >= 26 && b[0] === 0x42 && b[1] === 0x4d) return { width: u32le(b, 18) | 0, height: Math.abs(u32le(b, 22) | 0) };
  if (b.length >= 30 && u32be(b, 0) === 0x52494646 && u32be(b, 8) === 0x57454250) { // RIFF....WEBP
    const chunk = String.fromCharCode(...b.subarray(12, 16));
    if (chunk === "VP8 ") return { width: u16le(b, 26) & 0x3fff, height: u16le(b, 28) & 0x3fff };
    if (chunk === "VP8L") { const v = u32le(b, 21); return { width: (v & 0x3fff) + 1, height: ((v >>> 14) & 0x3fff) + 1 }; }
    if (chunk === "VP8X") return { width: 1 + (b[24] | (b[25] << 8) | (b[26] << 16)), height: 1 + (b[27] | (b[28] << 8) | (b[29] << 16)) };
    return null;
  }
  if (b.length >= 4 && b[0] === 0xff && b[1] === 0xd8) { // JPEG: the first start-of-frame marker (not DHT, JPG, DAC)
    for (let i = 2; i + 9 < b.length;) {
      if (b[i] !== 0xff) return null;
      const marker = b[i + 1];
      if (marker === 0xff) { i += 1; continue; }
      if (marker >= 0xc0 && marker <= 0xcf && ![0xc4, 0xc8, 0xcc].includes(marker)) return { width: u16be(b, i + 7), height: u16be(b, i + 5) };
      if (marker === 0xd8 || (marker >= 0xd0 && marker <= 0xd7) || marker === 0x01) { i += 2; continue; }
      i += 2 + u16be(b, i + 2);
    }
  }
  return null;
}

/** The size to decode an image of `width` x `height` at, or an ImageRefusal's sentence: whole up to SCALE_ABOVE
 * pixels, else scaled to about SCALED_PIXELS (the aspect kept); refused past MAX_PIXELS or MAX_SIDE_RATIO. */
export function decodeSize(width, height) {
  const mp = MAX_PIXELS / 1e6;
  if (!(width >= 1 && height >= 1)) return { refusal: "The image has no pixels." };
  if (width * height > MAX_PIXELS) {
    return { refusal: `The image is ${width} x ${height} pixels (${Math.round((width * height) / 1e6)} MP); the limit is ${mp} MP. Downscale it first.` };
  }
  if (Math.max(width, height) > MAX_SIDE_RATIO * Math.min(width, height)) {
    return { refusal: `This image is ${width} x ${height} pixels: a model would enlarge it to more than ${mp} MP before cropping; crop it closer to a square first.` };
  }
  if (width * height <= SCALE_ABOVE) return { width, height };
  const s = Math.sqrt(SCALED_PIXELS / (width * height));
  return { width: Math.max(1, Math.round(width * s)), height: Math.max(1, Math.round(height * s)) };
}

const HEADER_BYTES = 1 << 18;

/** A decoded image blob as {rgb (h*w*3), width, height}: transparency on white, EXIF orientation applied (as
 * vit_core.images decodes), no colour-space conversion (Pillow converts none either); sized from its header first
 * (decodeSize): a refused one throws an ImageRefusal before anything is decoded, a large one decodes scaled. */
export async function decodeBlob(blob) {
  const size = imageSize(new Uint8Array(await blob.slice(0, HEADER_BYTES).arrayBuffer()));
  if (!size) throw new Error("not an image this page reads"); // the page says: try a PNG or JPEG
  const target = decodeSize(size.width, size.height);
  if (target.refusal) throw new ImageRefusal(target.refusal);
  const scaled = target.width !== size.width || target.height !== size.height;
  const options = { colorSpaceConversion: "none", premultiplyAlpha: "none", imageOrientation: "from-image" };
  // Only a width, the shorter side's, keeps the aspect whether or not an EXIF rotation swaps the sides: at most about
  // SCALED_PIXELS come out either way.
  const resize = { resizeWidth: Math.min(target.width, target.height), resizeQuality: "high" };
  const bitmap = await createImageBitmap(blob, scaled ? { ...options, ...resize } : options);
  const c = new OffscreenCanvas(bitmap.width, bitmap.height);
  const ctx = c.getContext("2d", { colorSpace: "srgb" });
  ctx.drawImage(bitmap, 0, 0);
  bitmap.close();
  const data = ctx.getImageData(0, 0, c.width, c.height).data;
  return { rgb: rgbOnWhite(data), width: c.width, height: c.height };
}

/** A drawing canvas: white, strokes of `pen` px in dark ink; calls onStroke() when a stroke ends. */
export function drawingCanvas(size, pen, onStroke) {
  const c = document.createElement("canvas");
  c.width = c.height = size;
  c.id = "drawing";
  c.setAttribute("aria-label", "draw here");
  const ctx = c.getContext("2d", { willReadFrequently: true });
  const clear = () => { ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, size, size); };
  clear();
  let last = null;
  const at = (e) => {
    const r = c.getBoundingClientRect();
    return [((e.clientX - r.left) / r.width) * size, ((e.clientY - r.top) / r.height) * size];
  };
  c.addEventListener("pointerdown", (e) => { c.setPointerCapture(e.pointerId); last = at(e); e.preventDefault(); });
  c.addEventListener("pointermove", (e) => {
    if (!last) return;
    const p = at(e);
    ctx.strokeStyle = "#111"; ctx.lineWidth = pen; ctx.lineCap = ctx.lineJoin = "round";
    ctx.beginPath(); ctx.moveTo(...last); ctx.lineTo(...p); ctx.stroke();
    last = p;
  });
  const end = () => { if (last) { last = null; onStroke(); } };
  c.addEventListener("pointerup", end);
  c.addEventListener("pointercancel", end);
  return {
    element: c,
    clear,
    pixels: () => ({ rgb: rgbOnWhite(ctx.getImageData(0, 0, size, size).data), width: size, height: size }),
  };
}
