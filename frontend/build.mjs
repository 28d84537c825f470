// Bundles src/main.js (shared, every page), src/pages/*.js (one bundle per page) and src/css/app.css into
// dist/portal/. Pages are discovered by globbing, so adding a page never edits this file.
import { build } from "esbuild";
import { readdirSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";

const out = "dist/portal";
rmSync("dist", { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const pages = readdirSync("src/pages").filter((f) => f.endsWith(".js")).map((f) => join("src/pages", f));
const common = { bundle: true, minify: true, sourcemap: true, target: ["es2020"], logLevel: "info", legalComments: "linked" };

await build({ ...common, entryPoints: { app: "src/main.js", ...Object.fromEntries(pages.map((p) => [p.replace(/^src\/pages\//, "pages/").replace(/\.js$/, ""), p])) }, outdir: out, format: "iife" });
await build({ ...common, entryPoints: { app: "src/css/app.css" }, outdir: out, loader: { ".css": "css" } });
