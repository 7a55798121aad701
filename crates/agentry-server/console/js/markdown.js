// A small Markdown renderer that builds DOM nodes (never HTML strings, so nothing the model
// writes can inject markup): fenced code with highlighting, headings, lists, quotes, tables,
// paragraphs; inline code, bold, italics, strike-through and http(s) links; math (`$…$`,
// `\(…\)`, `$$…$$`, `\[…\]`) and ```mermaid diagrams as placeholders that rich.js renders.

import { h } from "./dom.js";
import { typeset } from "./rich.js";

/** A formula's placeholder: its TeX as text until KaTeX has drawn it. */
function math(tex, display) {
  return h(display ? "div" : "span", { class: `math${display ? " math-block" : ""}`, dataset: { tex, display: display ? "block" : "inline" } }, tex);
}

const KEYWORDS = new Set((
  "as async await break case catch class const continue def default defer del do elif else enum " +
  "except export extends false fn for from func function go if impl import in interface is let " +
  "loop match mod mut new nil none null of package pass pub raise return self static struct " +
  "super switch this throw trait true try type typeof use var void where while with yield " +
  "None True False select insert update delete create table where join and or not echo fi then"
).split(" "));

/** Code split into highlighted spans (strings, comments, numbers, keywords). */
export function highlight(code, lang) {
  const out = document.createDocumentFragment();
  const hashComments = /^(py|python|sh|bash|shell|zsh|ruby|rb|yaml|yml|toml|r|perl)$/i.test(lang || "");
  const pattern = hashComments
    ? /(#.*$)|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')|(\b\d[\d_.]*\b)|([A-Za-z_][\w]*)/gm
    : /(\/\/.*$|\/\*[\s\S]*?\*\/|--\s.*$)|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|(\b\d[\d_.]*\b)|([A-Za-z_][\w]*)/gm;
  let last = 0;
  for (const match of code.matchAll(pattern)) {
    if (match.index > last) out.append(code.slice(last, match.index));
    const [text, comment, string, number, word] = match;
    if (comment) out.append(h("span", { class: "tok-c" }, text));
    else if (string) out.append(h("span", { class: "tok-s" }, text));
    else if (number) out.append(h("span", { class: "tok-n" }, text));
    else if (word && KEYWORDS.has(word)) out.append(h("span", { class: "tok-k" }, text));
    else out.append(text);
    last = match.index + text.length;
  }
  if (last < code.length) out.append(code.slice(last));
  return out;
}

/** The URL as an absolute http(s) href, or null for any other scheme (javascript:, data:…). */
export function safeUrl(url) {
  try {
    const parsed = new URL(url, location.href);
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch { return null; }
}

/** Inline Markdown into nodes. */
export function inline(text) {
  const out = document.createDocumentFragment();
  // Math: `$…$` whose `$`s hug the formula and are not followed by a digit (so "$5 and $6" is
  // money), or `\(…\)`.
  const pattern = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|~~([^~]+)~~|\*([^*\s][^*]*)\*|(?<![\w])_([^_\s][^_]*)_(?![\w])|\[([^\]]+)\]\(([^)\s]+)\)|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])|(?<![\\$\w])\$(?![\s$])([^$\n]*?[^\s\\$])\$(?![\d$])|\\\(([\s\S]+?)\\\)/g;
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    if (m.index > last) out.append(text.slice(last, m.index));
    if (m[2] !== undefined) out.append(h("code", {}, m[2]));
    else if (m[3] !== undefined || m[4] !== undefined) out.append(h("strong", {}, inline(m[3] ?? m[4])));
    else if (m[5] !== undefined) out.append(h("del", {}, inline(m[5])));
    else if (m[6] !== undefined || m[7] !== undefined) out.append(h("em", {}, inline(m[6] ?? m[7])));
    else if (m[8] !== undefined) {
      const href = safeUrl(m[9]);
      out.append(href ? h("a", { href, target: "_blank", rel: "noopener noreferrer" }, inline(m[8])) : m[0]);
    } else if (m[10] !== undefined) {
      const href = safeUrl(m[10]);
      out.append(href ? h("a", { href, target: "_blank", rel: "noopener noreferrer" }, m[10]) : m[10]);
    } else if (m[11] !== undefined || m[12] !== undefined) {
      out.append(math((m[11] ?? m[12]).trim(), false));
    }
    last = m.index + m[0].length;
  }
  if (last < text.length) out.append(text.slice(last));
  return out;
}

function tableRow(line) {
  return line.replace(/^\s*\|/, "").replace(/\|\s*$/, "").split("|").map((cell) => cell.trim());
}

/** Markdown text into a fragment of block nodes (math and diagrams drawn as they are ready). */
export function markdown(text) {
  const out = blocks(text);
  typeset(out);
  return out;
}

/** Markdown text into block nodes. An unclosed code fence (mid-stream) still renders. */
function blocks(text) {
  const out = document.createDocumentFragment();
  const lines = String(text || "").replace(/\r\n/g, "\n").split("\n");
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) {
      const p = h("p");
      paragraph.forEach((line, n) => { if (n) p.append(h("br")); p.append(inline(line)); });
      out.append(p);
      paragraph = [];
    }
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const code = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) { code.push(lines[i]); i += 1; }
      i += 1;
      const lang = fence[2] || "";
      const closed = i <= lines.length;
      if (lang.toLowerCase() === "mermaid" && closed && code.join("").trim()) {
        out.append(h("div", { class: "diagram", dataset: { source: code.join("\n") } }, h("pre", {}, h("code", {}, code.join("\n")))));
      } else {
        out.append(h("pre", { dataset: lang ? { lang } : {} }, h("code", {}, highlight(code.join("\n"), lang))));
      }
      continue;
    }
    // Display math: `$$…$$` or `\[…\]`, on one line or over several.
    const display = line.match(/^\s*(\$\$|\\\[)(.*)$/);
    if (display) {
      const close = display[1] === "$$" ? "$$" : "\\]";
      const rest = display[2];
      const end = rest.indexOf(close);
      if (end >= 0 && rest.slice(end + close.length).trim() === "") {
        flush();
        if (rest.slice(0, end).trim()) out.append(math(rest.slice(0, end).trim(), true));
        i += 1;
        continue;
      }
      let j = i + 1;
      while (j < lines.length && !lines[j].includes(close)) j += 1;
      if (j < lines.length && lines[j].trim().endsWith(close) && end < 0) {
        flush();
        const last = lines[j].trim();
        const tex = [rest, ...lines.slice(i + 1, j), last.slice(0, last.length - close.length)].join("\n").trim();
        if (tex) out.append(math(tex, true));
        i = j + 1;
        continue;
      }
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flush();
      out.append(h(`h${Math.min(heading[1].length + 2, 6)}`, {}, inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s*([-*_])\s*\1\s*\1[\s\-*_]*$/.test(line)) { flush(); out.append(h("hr")); i += 1; continue; }
    if (/^\s*>/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) { quoted.push(lines[i].replace(/^\s*>\s?/, "")); i += 1; }
      out.append(h("blockquote", {}, blocks(quoted.join("\n"))));
      continue;
    }
    if (/^\s*\|.*\|\s*$/.test(line) && i + 1 < lines.length && /^\s*\|?\s*:?-{2,}/.test(lines[i + 1])) {
      flush();
      const head = tableRow(line);
      i += 2;
      const body = [];
      while (i < lines.length && /^\s*\|.*\|\s*$/.test(lines[i])) { body.push(tableRow(lines[i])); i += 1; }
      out.append(h("table", {},
        h("thead", {}, h("tr", {}, head.map((cell) => h("th", {}, inline(cell))))),
        h("tbody", {}, body.map((row) => h("tr", {}, row.map((cell) => h("td", {}, inline(cell))))))));
      continue;
    }
    const item = line.match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /\d/.test(item[2]);
      const list = h(ordered ? "ol" : "ul");
      while (i < lines.length) {
        const m = lines[i].match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
        if (!m) {
          if (/^\s{2,}\S/.test(lines[i]) && list.lastChild) { list.lastChild.append(" ", inline(lines[i].trim())); i += 1; continue; }
          break;
        }
        list.append(h("li", {}, inline(m[3])));
        i += 1;
      }
      out.append(list);
      continue;
    }
    if (line.trim() === "") { flush(); i += 1; continue; }
    paragraph.push(line);
    i += 1;
  }
  flush();
  return out;
}
