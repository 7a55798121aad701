// Microphone recording for the composer. The browser records in its own format (WebM/Opus in
// Chromium, MP4/AAC in Safari); the take is then decoded and written again as 16 kHz mono
// 16-bit WAV, the one format every audio model and speech model takes, as a data: URL.

/** Longest take, in seconds. */
export const MAX_SECONDS = 300;

export class Recorder {
  /** Asks for the microphone and starts recording. */
  async start() {
    if (!navigator.mediaDevices?.getUserMedia || typeof MediaRecorder === "undefined") {
      throw new Error("this browser cannot record audio");
    }
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    this.chunks = [];
    this.recorder = new MediaRecorder(this.stream);
    this.recorder.ondataavailable = (event) => { if (event.data.size) this.chunks.push(event.data); };
    this.stopped = new Promise((resolve) => { this.recorder.onstop = resolve; });
    this.recorder.start(250);
    this.started = Date.now();
  }

  /** Seconds recorded so far. */
  elapsed() {
    return this.started ? Math.floor((Date.now() - this.started) / 1000) : 0;
  }

  /** Stops and resolves with the take as a WAV data: URL. */
  async stop() {
    this.recorder.stop();
    await this.stopped;
    this.release();
    const blob = new Blob(this.chunks, { type: this.recorder.mimeType || "audio/webm" });
    return toWav(await blob.arrayBuffer());
  }

  /** Stops and drops the take. */
  cancel() {
    if (this.recorder && this.recorder.state !== "inactive") this.recorder.stop();
    this.release();
  }

  release() {
    if (this.stream) this.stream.getTracks().forEach((track) => track.stop());
    this.stream = null;
  }
}

/** Decodes recorded audio and resamples it to `rate` Hz mono WAV (a data: URL). */
export async function toWav(encoded, rate = 16000) {
  const context = new AudioContext();
  let decoded;
  try {
    decoded = await context.decodeAudioData(encoded);
  } finally {
    context.close();
  }
  const frames = Math.max(1, Math.ceil(decoded.duration * rate));
  const offline = new OfflineAudioContext(1, frames, rate);
  const source = offline.createBufferSource();
  source.buffer = decoded;
  source.connect(offline.destination);
  source.start();
  const rendered = await offline.startRendering();
  return wavDataUrl(rendered.getChannelData(0), rate);
}

/** 16-bit PCM WAV of mono `samples` (floats in -1..1) at `rate` Hz, as a data: URL. */
export function wavDataUrl(samples, rate) {
  const buffer = new ArrayBuffer(44 + samples.length * 2);
  const view = new DataView(buffer);
  const ascii = (offset, text) => { for (let i = 0; i < text.length; i++) view.setUint8(offset + i, text.charCodeAt(i)); };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + samples.length * 2, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // the fmt chunk's size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // one channel
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 2, true); // bytes per second
  view.setUint16(32, 2, true); // bytes per frame
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, samples.length * 2, true);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(44 + i * 2, s < 0 ? s * 0x8000 : s * 0x7fff, true);
  }
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return `data:audio/wav;base64,${btoa(binary)}`;
}
