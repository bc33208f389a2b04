// The page: translate the text box's lines through POST /translate, list the translations, and draw the
// cross-attention of a chosen one as a heatmap (target pieces down, source pieces across) with its word
// alignment as links. Plain JavaScript: no framework, no build step, nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
let chosen = null;  // the translation being inspected: {text, alignment, attention}
const KEY = "transformer_mt_key";  // the API key: kept for this tab
let key = sessionStorage.getItem(KEY);
let limits = {max_attention_texts: 4, max_attention_chars: 300};  // the service's, from GET /model

function authorization() {
  // a header carries bytes: the key's UTF-8 bytes, one character each (so a non-ASCII key works too)
  if (key === null) return {};
  return {"Authorization": `Bearer ${String.fromCharCode(...new TextEncoder().encode(key))}`};
}

async function call(path, options = {}) {
  // fetch with the API key; a 401 shows the key form and is thrown like any other error
  const response = await fetch(path, {...options, headers: {...(options.headers || {}), ...authorization()}});
  const answer = await response.json();
  if (response.status === 401) $("key-form").hidden = false;
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

async function post(body) {
  const headers = {"Content-Type": "application/json"};
  const answer = await call("/translate", {method: "POST", headers, body: JSON.stringify(body)});
  return answer.translations.map((entry) => (Array.isArray(entry) ? entry : [entry]).map(unpackAttention));
}

function useKey(event) {
  event.preventDefault();
  key = $("key").value;
  sessionStorage.setItem(KEY, key);
  $("key-form").hidden = true;
  describeModel();
}

async function describeModel() {
  let m;
  try {
    m = await call("/model");
  } catch (error) {
    $("model").textContent = `the model's description: ${error.message}`;
    return;
  }
  limits = m.limits;
  if (key !== null) await fetch("/docs/access", {method: "POST", headers: authorization()});  // opens /docs
  const directions = m.directions.map(([source, target]) => `${source} → ${target}`).join(", ");
  $("model").textContent = `${directions}: ${m.decoder_layers} decoder layers, ` +
    `${m.heads} heads, ${(m.parameters / 1e6).toFixed(2)}M parameters, vocabulary ${m.vocab_size}`;
  if (m.multilingual) {  // every request names the language to translate into
    fillSelect($("target-lang"), m.target_languages.map((code) => [code, code]), m.target_languages[0]);
    $("target-label").hidden = false;
  }
}

async function translate(event) {
  event.preventDefault();
  const texts = $("texts").value.split("\n");
  const beam = Number($("beam").value), nbest = Number($("nbest").value);
  $("status").textContent = "translating…";
  try {
    const attention = texts.length <= limits.max_attention_texts &&
      texts.every((text) => text.length <= limits.max_attention_chars);  // else translations alone
    // terms: phrases every translation must hold (constraints), separated by ";"
    const constraints = $("constraints").value.split(";").map((term) => term.trim()).filter((term) => term);
    const entries = constraints.length ? texts.map((text) => ({text, constraints})) : texts;
    const request = {texts: entries, beam, nbest, with_scores: true, alignments: true, attention};
    if (!$("target-label").hidden) request.target_lang = $("target-lang").value;
    showResults(texts, await post(request));
    $("status").textContent = "";
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  }
}

function float16(bits) {
  // an IEEE half-precision number from its 16 bits
  const sign = bits & 0x8000 ? -1 : 1, exponent = (bits >> 10) & 0x1f, fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

function unpack({shape, data}) {
  // {"dtype": "float16", "shape", "data": base64 little-endian} -> nested arrays of that shape
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  let i = 0;
  const build = (dims) => (dims.length === 0 ? float16(view.getUint16(2 * i++, true))
    : Array.from({length: dims[0]}, () => build(dims.slice(1))));
  return build(shape);
}

function unpackAttention(hyp) {
  if (hyp.attention) hyp.attention.cross = unpack(hyp.attention.cross);  // [layer][head][target][source]
  return hyp;
}

function showResults(texts, found) {
  const list = $("results");
  list.replaceChildren();
  found.forEach((hyps, n) => {
    hyps.forEach((hyp, rank) => {
      const item = document.createElement("li");
      item.className = "translation";
      item.textContent = hyp.text || "(blank line)";
      const score = document.createElement("span");
      score.className = "score";
      score.textContent = `log-prob ${hyp.score.toFixed(3)}` + (hyps.length > 1 ? `, rank ${rank + 1}` : "") +
        (hyp.met === false ? ", not every term fits" : "");
      item.append(score);
      if (hyp.attention) {  // the best translation of a non-blank line
        const look = document.createElement("button");
        look.textContent = "attention";
        look.className = "look";
        look.addEventListener("click", () => inspect(hyp));
        item.append(look);
      }
      list.append(item);
    });
  });
  const first = found.find((hyps) => hyps[0].attention);
  if (first) inspect(first[0]);
}

function inspect(hyp) {
  chosen = hyp;
  $("chosen").textContent = hyp.text;
  const layers = hyp.attention.cross.length, heads = hyp.attention.cross[0].length;
  fillSelect($("layer"), [...Array(layers).keys()].map((l) => [l, `${l}`]), Math.max(layers - 2, 0));
  fillSelect($("head"), [["mean", "mean of the heads"], ...[...Array(heads).keys()].map((h) => [h, `${h}`])],
             "mean");
  $("inspect").hidden = false;
  draw();
}

function fillSelect(select, options, value) {
  select.replaceChildren(...options.map(([v, label]) => new Option(label, v)));
  select.value = String(value);
}

function weights() {
  // the chosen layer's (target, source) weights: one head's, or the mean of the heads
  const layer = chosen.attention.cross[Number($("layer").value)];
  const head = $("head").value;
  if (head !== "mean") return layer[Number(head)];
  return layer[0].map((row, t) => row.map((_, s) => layer.reduce((sum, h) => sum + h[t][s], 0) / layer.length));
}

function draw() {
  const {source_pieces: source, target_pieces: target} = chosen.attention;
  const w = weights();
  const table = document.createElement("table");
  table.className = "heatmap";
  const head = table.createTHead().insertRow();
  head.append(document.createElement("th"));
  source.forEach((piece, s) => {
    const th = document.createElement("th");
    th.textContent = piece;
    th.dataset.source = s;
    head.append(th);
  });
  const body = table.createTBody();
  target.forEach((piece, t) => {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.textContent = piece;
    th.dataset.target = t;
    row.append(th);
    source.forEach((_, s) => {
      const cell = row.insertCell();
      const value = w[t][s];
      cell.dataset.row = t;
      cell.dataset.col = s;
      cell.dataset.value = value.toFixed(5);
      cell.title = `${piece} → ${source[s]}: ${value.toFixed(3)}`;
      cell.style.background = `rgba(40, 80, 200, ${value})`;
      cell.addEventListener("mouseenter", () => highlight(table, t, s, true));
      cell.addEventListener("mouseleave", () => highlight(table, t, s, false));
    });
  });
  $("heatmap").replaceChildren(table);
  drawLinks();
}

function highlight(table, t, s, on) {
  table.querySelector(`th[data-target="${t}"]`).classList.toggle("lit", on);
  table.querySelector(`th[data-source="${s}"]`).classList.toggle("lit", on);
  table.querySelector(`td[data-row="${t}"][data-col="${s}"]`).classList.toggle("hover", on);
}

function words(pieces) {
  // SentencePiece pieces -> words: a piece starting with "▁" starts a word (EOS "</s>" left out)
  const out = [];
  pieces.filter((p) => p !== "</s>").forEach((piece) => {
    if (piece.startsWith("\u2581") || out.length === 0) out.push(piece.replace("\u2581", ""));
    else out[out.length - 1] += piece;
  });
  return out;
}

function drawLinks() {
  // the word alignment (Pharaoh "i-j": source word i, target word j) as lines between two rows of words
  const svg = $("links");
  const source = words(chosen.attention.source_pieces), target = words(chosen.attention.target_pieces);
  const width = svg.clientWidth || 800;
  const x = (i, n) => ((i + 0.5) * width) / Math.max(n, 1);
  const parts = [];
  const pairs = (chosen.alignment || "").split(" ").filter(Boolean).map((p) => p.split("-").map(Number));
  pairs.forEach(([i, j]) => parts.push(
    `<line data-source="${i}" data-target="${j}" x1="${x(i, source.length)}" y1="22" x2="${x(j, target.length)}" y2="110"></line>`));
  source.forEach((w, i) => parts.push(
    `<text class="word" data-source-word="${i}" x="${x(i, source.length)}" y="16" text-anchor="middle">${escape(w)}</text>`));
  target.forEach((w, j) => parts.push(
    `<text class="word" data-target-word="${j}" x="${x(j, target.length)}" y="128" text-anchor="middle">${escape(w)}</text>`));
  svg.innerHTML = parts.join("");
}

function escape(text) {
  return text.replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
}

$("form").addEventListener("submit", translate);
$("key-form").addEventListener("submit", useKey);
$("layer").addEventListener("change", draw);
$("head").addEventListener("change", draw);
describeModel();
