import { defineConfig } from "vite";

// The dashboard is served by the gateway from dist/: hashed files under assets/ (cached for
// good), index.html never cached. No inline script anywhere (the gateway's CSP forbids it).
export default defineConfig({
  oxc: { jsx: { runtime: "automatic", importSource: "preact" } },
  build: {
    outDir: "dist",
    assetsDir: "assets",
    target: "es2022",
    modulePreload: { polyfill: false },
    sourcemap: false,
    chunkSizeWarningLimit: 600,
  },
  server: { proxy: { "/v1": { target: "http://127.0.0.1:8080", ws: true } } },
});
