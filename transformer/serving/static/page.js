// The page: translate the text box's lines through POST /translate, list the translations, and draw the
// cross-attention of a chosen one as a heatmap (target pieces down, source pieces across) with its word
// alignment as links. Plain JavaScript: no framework, no build step, nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
let chosen = null;  // the translation being inspected: {text, alignment, attention}

async function post(body) {
  const response = await fetch("/translate", {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer.translations;
}

async function describeModel() {
  const response = await fetch("/model");
  if (!response.ok) return;
  const m = await response.json();
  $("model").textContent = `${m.source_language} → ${m.target_language}: ${m.decoder_layers} decoder layers, ` +
    `${m.heads} heads, ${(m.parameters / 1e6).toFixed(2)}M parameters, vocabulary ${m.vocab_size}`;
}

async function translate(event) {
  event.preventDefault();
  const texts = $("texts").value.split("\n");
  const beam = Number($("beam").value), nbest = Number($("nbest").value);
  $("status").textContent = "translating…";
  try {
    const found = await post({texts, beam, nbest, with_scores: true, alignments: true, attention: true});
    showResults(texts, found.map((entry) => (Array.isArray(entry) ? entry : [entry])));
    $("status").textContent = "";
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  }
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
      score.textContent = `log-prob ${hyp.score.toFixed(3)}` + (hyps.length > 1 ? `, rank ${rank + 1}` : "");
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
$("layer").addEventListener("change", draw);
$("head").addEventListener("change", draw);
describeModel();
