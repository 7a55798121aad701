// Math and diagrams in rendered Markdown. The Markdown renderer leaves placeholders holding the
// source as text (`.math` with `data-tex`, `.diagram` with `data-source`); `typeset` loads the
// vendored library the first time one is needed (KaTeX, written as MathML, which the browser
// lays out itself; mermaid, in its strict security level) and renders each placeholder in
// place. Neither library's output is inserted as markup: KaTeX builds DOM nodes, and mermaid's
// SVG is rebuilt element by element — drawing elements only, no scripts, handlers or
// `javascript:` links — its `style` attributes applied through the CSSOM and its `<style>`
// carrying the page's nonce.
// When rendering fails, the source stays, marked as an error.

import "./nonce.js";

const scripts = new Map();
/** Loads a vendored script once; resolves with the global it defines. */
function load(src, global) {
  if (!scripts.has(src)) {
    scripts.set(src, new Promise((resolve, reject) => {
      const el = document.createElement("script");
      el.src = src;
      el.onload = () => (globalThis[global] ? resolve(globalThis[global]) : reject(new Error(`${src} defined no ${global}`)));
      el.onerror = () => reject(new Error(`cannot load ${src}`));
      document.head.append(el);
    }));
  }
  return scripts.get(src);
}

/** Rendered math by source, cloned for the next placeholder with the same formula. */
const mathDone = new Map();

async function renderMath(el) {
  const tex = el.dataset.tex;
  const display = el.dataset.display === "block";
  const key = `${display ? "B" : "I"}${tex}`;
  let rendered = mathDone.get(key);
  if (!rendered) {
    const katex = await load("/console/vendor/katex/katex.min.js", "katex");
    const holder = document.createElement("span");
    katex.render(tex, holder, { output: "mathml", displayMode: display, throwOnError: true, trust: false, strict: "ignore", maxSize: 50, maxExpand: 1000 });
    rendered = holder;
    mathDone.set(key, rendered);
    if (mathDone.size > 500) mathDone.delete(mathDone.keys().next().value);
  }
  el.replaceChildren(...[...rendered.childNodes].map((node) => node.cloneNode(true)));
}

let mermaid = null;
let diagrams = 0;
/** Rendered diagrams by source and theme. */
const diagramDone = new Map();

function mermaidLib() {
  if (!mermaid) {
    mermaid = load("/console/vendor/mermaid/mermaid.min.js", "mermaid").then((lib) => {
      // `loose` skips mermaid's own sanitising of its output (DOMPurify parses it as markup, which
      // the CSP reports); importSvg keeps only drawing elements, and directives in a diagram
      // may not change what is listed in `secure`.
      lib.initialize({
        startOnLoad: false, securityLevel: "loose", htmlLabels: false, flowchart: { htmlLabels: false },
        secure: ["secure", "securityLevel", "startOnLoad", "maxTextSize", "maxEdges", "htmlLabels", "flowchart", "themeCSS", "dompurifyConfig"],
        theme: document.documentElement.dataset.theme === "dark" ? "dark" : "default",
      });
      return lib;
    });
  }
  return mermaid;
}

const SVG_NS = "http://www.w3.org/2000/svg";
const XLINK_NS = "http://www.w3.org/1999/xlink";
const ENTITIES = { lt: "<", gt: ">", amp: "&", quot: '"', apos: "'", nbsp: "\u00a0" };
const decode = (text) => text.replace(/&(#x[0-9a-f]+|#\d+|\w+);/gi, (all, name) => {
  if (name[0] === "#") {
    const code = name[1] === "x" || name[1] === "X" ? parseInt(name.slice(2), 16) : parseInt(name.slice(1), 10);
    return Number.isFinite(code) && code > 0 && code < 0x110000 ? String.fromCodePoint(code) : "";
  }
  return ENTITIES[name.toLowerCase()] ?? all;
});
/** Elements a diagram may hold; anything else (script, foreignObject, …) is dropped with its content. */
const ALLOWED = new Set(("svg g defs style title desc marker path rect circle ellipse line polyline polygon text tspan " +
  "textPath use symbol clipPath mask pattern linearGradient radialGradient stop filter feDropShadow feGaussianBlur " +
  "feOffset feBlend feFlood feComposite feMerge feMergeNode image a switch").split(" "));

/**
 * Mermaid's serialised SVG as nodes of this page, built element by element (not parsed as
 * markup, which the CSP would report): only drawing elements, no event handlers, no
 * `javascript:` links; `style` attributes go through the CSSOM and `<style>` gets the nonce.
 */
function importSvg(text) {
  const token = /<!--[\s\S]*?-->|<\?[\s\S]*?\?>|<!\[CDATA\[([\s\S]*?)\]\]>|<(\/?)([\w:.-]+)((?:\s+[\w:.-]+\s*=\s*(?:"[^"]*"|'[^']*'))*)\s*(\/?)>|([^<]+)/g;
  const attribute = /([\w:.-]+)\s*=\s*(?:"([^"]*)"|'([^']*)')/g;
  const root = document.createElementNS(SVG_NS, "g");
  const stack = [root];
  let skipping = 0;
  for (const m of text.matchAll(token)) {
    const [, cdata, closing, name, attrs, selfClosing, chars] = m;
    const top = stack[stack.length - 1];
    if (name !== undefined) {
      const local = name.includes(":") ? name.split(":").pop() : name;
      if (closing) {
        if (skipping) skipping -= 1;
        else if (stack.length > 1) stack.pop();
        continue;
      }
      if (skipping || !ALLOWED.has(local)) {
        if (!selfClosing) skipping += 1;
        continue;
      }
      const el = document.createElementNS(SVG_NS, local);
      for (const a of attrs.matchAll(attribute)) {
        const key = a[1];
        const value = decode(a[2] ?? a[3] ?? "");
        if (/^on/i.test(key) || key === "xmlns" || key.startsWith("xmlns:")) continue;
        if (/(^|:)href$/i.test(key)) {
          if (!/^(#|https?:)/i.test(value.trim())) continue;
          el.setAttributeNS(key.includes(":") ? XLINK_NS : null, key.includes(":") ? "xlink:href" : "href", value);
          continue;
        }
        el.setAttribute(key, value);
      }
      top.append(el);
      if (!selfClosing) stack.push(el);
    } else if (!skipping && (chars !== undefined || cdata !== undefined)) {
      top.append(document.createTextNode(cdata ?? decode(chars)));
    }
  }
  const svg = root.firstElementChild;
  if (!svg || svg.localName !== "svg") throw new Error("the diagram is not SVG");
  // The id stays: the diagram's own styles select by it.
  return svg;
}

async function renderDiagram(el) {
  const source = el.dataset.source;
  const key = `${document.documentElement.dataset.theme}:${source}`;
  // The promise is kept, so a diagram re-drawn while it renders (a streamed answer) waits for it.
  let made = diagramDone.get(key);
  if (!made) {
    made = mermaidLib().then(async (lib) => {
      diagrams += 1;
      const { svg } = await lib.render(`agentry-diagram-${diagrams}`, source);
      return importSvg(svg);
    });
    diagramDone.set(key, made);
    made.catch(() => diagramDone.delete(key));
    if (diagramDone.size > 100) diagramDone.delete(diagramDone.keys().next().value);
  }
  el.replaceChildren((await made).cloneNode(true));
}

/** Renders every math and diagram placeholder in `root` (each once). */
export function typeset(root) {
  for (const el of root.querySelectorAll(".math:not([data-state]), .diagram:not([data-state])")) {
    el.dataset.state = "rendering";
    const work = el.classList.contains("math") ? renderMath(el) : renderDiagram(el);
    work.then(() => { el.dataset.state = "done"; }, (error) => {
      el.dataset.state = "error";
      el.title = `Not rendered: ${error.message || error}`;
    });
  }
}
