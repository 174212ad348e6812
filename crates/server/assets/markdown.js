// A small Markdown renderer that builds DOM nodes: every piece of text becomes a text
// node, so no HTML in a reply is ever parsed. The subset: paragraphs, headings, emphasis,
// strikethrough, inline code, fenced code blocks (with a copy button), lists, block
// quotes, rules, tables, and links to http(s) only.

/** Element `tag` with `className` and text or children. */
export function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child == null) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

/** A titled block with a copy button around `text` in a <pre>: code, JSON, tool calls. */
export function codeBlock(title, text) {
  const copy = el("button", null, "Copy");
  copy.type = "button";
  copy.setAttribute("aria-label", `Copy ${title || "code"}`);
  copy.addEventListener("click", () => copyText(text, copy));
  const code = el("code", null, text);
  return el("div", "block", el("div", "block-head", el("span", null, title || "code"), copy), el("pre", null, code));
}

function copyText(text, button) {
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => { button.textContent = "Copy failed"; });
  } else {
    // Plain http off loopback has no clipboard API: select the text for Ctrl+C instead.
    const pre = button.closest(".block").querySelector("pre");
    const range = document.createRange();
    range.selectNodeContents(pre);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    button.textContent = "Selected";
  }
}

/** Only absolute http(s) URLs become links; anything else (javascript:, data:) stays text. */
export function safeUrl(text) {
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

function link(href, label) {
  const a = el("a", null);
  a.href = href;
  a.rel = "noopener noreferrer";
  a.target = "_blank";
  inline(label, a);
  return a;
}

const INLINE = new RegExp([
  /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source, // 1, 2: code span
  /\[([^\]\n]+)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"\n]*")?\s*\)/.source, // 3, 4: link
  /\*\*(?=\S)([\s\S]*?\S)\*\*/.source, // 5: strong
  /(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/.source, // 6: strong
  /\*(?=[^\s*])([\s\S]*?[^\s*])\*/.source, // 7: emphasis
  /(?<!\w)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/.source, // 8: emphasis
  /~~(?=\S)([\s\S]*?\S)~~/.source, // 9: strikethrough
  /(https?:\/\/[^\s<>"]*[^\s<>".,;:!?)\]'])/.source, // 10: bare URL
].join("|"), "g");

/** Appends `text`'s inline Markdown to `parent`. */
export function inline(text, parent) {
  const re = new RegExp(INLINE.source, "g");
  let last = 0;
  for (let m; (m = re.exec(text)); ) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = re.lastIndex;
    if (m[2] !== undefined) {
      const body = m[2].length > 2 && m[2].startsWith(" ") && m[2].endsWith(" ") ? m[2].slice(1, -1) : m[2];
      parent.append(el("code", null, body));
    } else if (m[3] !== undefined) {
      const href = safeUrl(m[4]);
      if (href) parent.append(link(href, m[3]));
      else parent.append(m[0]);
    } else if (m[5] !== undefined || m[6] !== undefined) {
      inline(m[5] ?? m[6], parent.appendChild(el("strong")));
    } else if (m[7] !== undefined || m[8] !== undefined) {
      inline(m[7] ?? m[8], parent.appendChild(el("em")));
    } else if (m[9] !== undefined) {
      inline(m[9], parent.appendChild(el("del")));
    } else {
      const href = safeUrl(m[10]);
      parent.append(href ? link(href, m[10]) : m[10]);
    }
  }
  if (last < text.length) parent.append(text.slice(last));
}

/** Inline text whose single newlines are kept as line breaks. */
function lines(text, parent) {
  text.split("\n").forEach((line, i) => {
    if (i) parent.append(el("br"));
    inline(line, parent);
  });
  return parent;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function cells(row) {
  return row.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
}

function startsBlock(line, next) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || ITEM.test(line)
    || QUOTE.test(line) || (line.includes("|") && next !== undefined && TABLE_SEP.test(next) && next.includes("-"));
}

/** A DocumentFragment of `source` rendered; an unclosed fence (while streaming) runs to the end. */
export function render(source) {
  const out = document.createDocumentFragment();
  blocks(source.replace(/\r\n?/g, "\n").split("\n"), out);
  return out;
}

function blocks(src, out) {
  let i = 0;
  while (i < src.length) {
    const line = src[i];
    if (!line.trim()) { i++; continue; }
    let m;
    if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      for (i++; i < src.length && !src[i].trim().startsWith(fence); i++) body.push(src[i]);
      i++;
      out.append(codeBlock(m[2], body.join("\n")));
    } else if ((m = HEADING.exec(line))) {
      out.append(inlineInto(el(`h${Math.min(m[1].length + 2, 6)}`), m[2]));
      i++;
    } else if (RULE.test(line)) {
      out.append(el("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      const inner = [];
      for (; i < src.length && (m = QUOTE.exec(src[i])); i++) inner.push(m[1]);
      const quote = el("blockquote");
      blocks(inner, quote);
      out.append(quote);
    } else if ((m = ITEM.exec(line))) {
      i = list(src, i, out);
    } else if (line.includes("|") && src[i + 1] !== undefined && TABLE_SEP.test(src[i + 1]) && src[i + 1].includes("-")) {
      i = table(src, i, out);
    } else {
      const para = [line];
      for (i++; i < src.length && src[i].trim() && !startsBlock(src[i], src[i + 1]); i++) para.push(src[i]);
      out.append(lines(para.join("\n"), el("p")));
    }
  }
}

function inlineInto(node, text) {
  inline(text, node);
  return node;
}

/** A list from line `i`: items at its indentation, deeper lines nested inside. */
function list(src, i, out) {
  const first = ITEM.exec(src[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  while (i < src.length) {
    const m = ITEM.exec(src[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3]];
    for (i++; i < src.length; i++) {
      const line = src[i];
      const sub = ITEM.exec(line);
      if (!line.trim()) {
        const next = src[i + 1];
        if (next !== undefined && next.trim() && next.startsWith(" ".repeat(indent + 2))) { body.push(""); continue; }
        // A blank line between items of one list keeps the list going.
        const nextItem = next !== undefined && ITEM.exec(next);
        if (nextItem && nextItem[1].length === indent) i++;
        break;
      }
      if (sub && sub[1].length <= indent) break;
      if (!sub && !line.startsWith(" ") && startsBlock(line, src[i + 1])) break;
      body.push(line.slice(Math.min(indent + 2, line.length - line.trimStart().length)));
    }
    const item = el("li");
    if (body.length === 1) inline(body[0], item);
    else blocks(body, item);
    node.append(item);
  }
  out.append(node);
  return i;
}

function table(src, i, out) {
  const head = cells(src[i]);
  const aligns = cells(src[i + 1]).map((c) => (c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : ""));
  const thead = el("tr");
  head.forEach((c) => thead.append(inlineInto(el("th"), c)));
  const tbody = el("tbody");
  for (i += 2; i < src.length && src[i].includes("|") && src[i].trim(); i++) {
    const row = el("tr");
    cells(src[i]).forEach((c, k) => {
      const td = inlineInto(el("td"), c);
      if (aligns[k]) td.align = aligns[k];
      row.append(td);
    });
    tbody.append(row);
  }
  out.append(el("div", "md-table", el("table", null, el("thead", null, thead), tbody)));
  return i;
}
