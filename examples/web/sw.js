// The demo's service worker: keeps the page's files, and the engine's package, for offline
// use (cache first, refreshed from the network when it answers). The model's files are in
// the "pagellm-models" cache, which the engine fills as it downloads them.
const CACHE = "pagellm-demo-v2";
const SHELL = ["./", "index.html", "main.js", "worker.js",
  "../../web/pkg/pagellm.js", "../../web/pkg/pagellm_web.js", "../../web/pkg/pagellm_web_bg.wasm"];

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(CACHE).then((c) => c.addAll(SHELL)).then(() => self.skipWaiting()));
});
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== "GET" || url.origin !== self.location.origin) return;
  event.respondWith((async () => {
    const cache = await caches.open(CACHE);
    const network = fetch(event.request).then((r) => {
      const file = url.origin + url.pathname;
      if (r.ok && SHELL.some((s) => new URL(s, self.location.href).href === file)) {
        cache.put(event.request, r.clone());
      }
      return r;
    });
    // The page is opened with a query (the form's fields); its file is the same.
    const cached = await cache.match(event.request, { ignoreSearch: event.request.mode === "navigate" });
    if (cached) {
      network.catch(() => {});
      return cached;
    }
    return network;
  })());
});
