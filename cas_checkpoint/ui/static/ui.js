// Loads a closed part of a state when it is opened, a subtree at a time. The server sends
// HTML it has escaped; nothing from a state is ever put into the page as markup here.
"use strict";
async function load(url) {
  const r = await fetch(url, { headers: { "Accept": "text/html" } });
  if (!r.ok) { throw new Error(r.status + " " + r.statusText); }
  return r.text();
}
document.addEventListener("toggle", async (ev) => {
  const d = ev.target;
  if (!(d instanceof HTMLDetailsElement) || !d.open || !d.dataset.src || d.dataset.loaded) {
    return;
  }
  d.dataset.loaded = "1";
  const kids = d.querySelector(":scope > .kids") || d;
  kids.textContent = "loading…";
  try {
    kids.innerHTML = await load(d.dataset.src);
  } catch (e) {
    kids.textContent = "could not load: " + e.message;
    delete d.dataset.loaded;
  }
}, true);
document.addEventListener("click", async (ev) => {
  const b = ev.target;
  if (!(b instanceof HTMLButtonElement) || !b.classList.contains("more") || !b.dataset.src) {
    return;
  }
  b.disabled = true;
  try {
    const html = await load(b.dataset.src);
    const box = document.createElement("div");
    box.className = "loaded";
    box.innerHTML = html;
    b.replaceWith(box);
  } catch (e) {
    b.textContent = "could not load: " + e.message;
    b.disabled = false;
  }
});
