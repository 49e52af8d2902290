// The student's image: an example, a photo (a file input; phones offer their camera) or a drawing, as RGB pixels.

import { rgbOnWhite } from "./preprocess.js";

/** A decoded image blob as {rgb (h*w*3), width, height}: transparency on white, EXIF orientation applied (as
 * vit_core.images decodes), no colour-space conversion (Pillow converts none either). */
export async function decodeBlob(blob) {
  const bitmap = await createImageBitmap(blob, { colorSpaceConversion: "none", premultiplyAlpha: "none", imageOrientation: "from-image" });
  const c = new OffscreenCanvas(bitmap.width, bitmap.height);
  const ctx = c.getContext("2d", { colorSpace: "srgb" });
  ctx.drawImage(bitmap, 0, 0);
  const data = ctx.getImageData(0, 0, bitmap.width, bitmap.height).data;
  return { rgb: rgbOnWhite(data), width: bitmap.width, height: bitmap.height };
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
