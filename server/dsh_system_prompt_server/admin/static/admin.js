// Live views: the server sends the view's HTML again whenever it changed (server-sent events).
"use strict";

const live = document.getElementById("live");
const status = document.getElementById("status");

if (live && live.dataset.events && window.EventSource) {
  const source = new EventSource(live.dataset.events);
  source.addEventListener("update", (event) => {
    live.innerHTML = event.data;
    live.dataset.updates = String(Number(live.dataset.updates || 0) + 1);
    status.textContent = "live";
    status.className = "status";
  });
  // The sidecar ends a live view after a while: it resumes on a click, not by itself.
  source.addEventListener("idle", () => {
    source.close();
    status.textContent = "paused: click to resume";
    status.className = "status off";
    document.addEventListener("click", () => window.location.reload(), { once: true });
  });
  source.addEventListener("error", () => {
    status.textContent = source.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting";
    status.className = "status off";
  });
}

for (const select of document.querySelectorAll("select[data-autosubmit]")) {
  select.addEventListener("change", () => select.form.submit());
}
for (const select of document.querySelectorAll("select[data-history]")) {
  select.addEventListener("change", () => { window.location.href = select.value; });
}
