#!/usr/bin/env node
// Drive the pubsubclub chat page in Debian's headless Chromium (playwright-core).
//
//   node chat_browser.js URL_A URL_B [--screenshot PATH] [--nick NICK] [--text TEXT]
//                        [--timeout S] [--no-check-a]
//
// Opens URL_A and URL_B in two separate browser contexts, waits until #status is
// "connected" on both, types --nick (default "alice") and --text (default a unique
// "hello from A <random>") on A and clicks #send, then waits (--timeout, default
// 20 s) until an <li> of B's #messages contains the text. Unless --no-check-a, A
// must show the message too (published with exclude_me: false).
// Success: prints {"ok": true, "seen_on_b": "<li text>", "seen_on_a": "<li text>"}
// and exits 0. Failure: prints {"ok": false, "error": "...", ...debug} and exits 1.
// --screenshot PATH saves a PNG of page B (also on failure, when possible).
// Exit 2 on bad usage.
"use strict";

const path = require("path");
const { chromium } = require(path.resolve(__dirname, "..", "..", "js", "node_modules", "playwright-core"));

const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const CHROMIUM_ARGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

function usage(msg) {
  process.stderr.write((msg ? msg + "\n" : "") +
    "usage: chat_browser.js URL_A URL_B [--screenshot PATH] [--nick NICK] [--text TEXT] [--timeout S] [--no-check-a]\n");
  process.exit(2);
}

const opts = { nick: "alice", timeout: "20", checkA: true, watch: false };
const urls = [];
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === "-h" || a === "--help") { usage(); }
  else if (a === "--no-check-a") { opts.checkA = false; }
  else if (a === "--watch") { opts.watch = true; }
  else if (["--screenshot", "--nick", "--text", "--timeout"].includes(a)) {
    if (i + 1 >= argv.length) { usage("missing value for " + a); }
    opts[a.slice(2)] = argv[++i];
  } else if (a.startsWith("--")) { usage("unknown option " + a); }
  else { urls.push(a); }
}
// --watch URL --text TEXT: open one page, print {"connected": true}, then wait for TEXT
// to show up there (sent by something else: another protocol's client).
if (urls.length !== (opts.watch ? 1 : 2)) { usage(opts.watch ? "--watch takes one URL" : "need exactly two URLs"); }
if (opts.watch && !opts.text) { usage("--watch needs --text"); }
const timeoutMs = Number(opts.timeout) * 1000;
if (!(timeoutMs > 0)) { usage("--timeout must be > 0"); }
const text = opts.text || ("hello from A " + Math.random().toString(36).slice(2, 10));
const expected = opts.nick + ": " + text;

const debug = { a: { console: [] }, b: { console: [] } };

function out(obj) {
  return new Promise((resolve) => process.stdout.write(JSON.stringify(obj) + "\n", resolve));
}

async function openPage(browser, url, log) {
  const context = await browser.newContext({ viewport: { width: 800, height: 640 } });
  const page = await context.newPage();
  page.on("console", (m) => log.push(m.type() + ": " + m.text()));
  page.on("pageerror", (e) => log.push("pageerror: " + e.message));
  const resp = await page.goto(url, { timeout: timeoutMs, waitUntil: "load" });
  if (!resp || !resp.ok()) { throw new Error("GET " + url + " -> " + (resp ? resp.status() : "no response")); }
  return page;
}

async function statusOf(page) {
  try {
    return await page.evaluate(() => {
      const s = document.querySelector("#status"), d = document.querySelector("#detail");
      return { status: s && s.textContent, detail: d && d.textContent,
               autobahn: typeof window.autobahn !== "undefined" ? window.autobahn.version : null };
    });
  } catch (e) { return { error: e.message }; }
}

async function waitConnected(page, name) {
  try {
    await page.waitForFunction(
      () => { const s = document.querySelector("#status"); return s && s.textContent === "connected"; },
      null, { timeout: timeoutMs });
  } catch (e) {
    const st = await statusOf(page);
    throw new Error("page " + name + " not connected within " + opts.timeout + " s: " + JSON.stringify(st));
  }
}

async function waitMessage(page, name) {
  try {
    const handle = await page.waitForFunction((t) => {
      for (const li of document.querySelectorAll("#messages li")) {
        if (li.textContent.includes(t)) { return li.textContent; }
      }
      return false;
    }, text, { timeout: timeoutMs });
    return await handle.jsonValue();
  } catch (e) {
    const items = await page.$$eval("#messages li", (lis) => lis.map((li) => li.textContent)).catch(() => null);
    throw new Error("message not seen on page " + name + " within " + opts.timeout + " s; #messages: " + JSON.stringify(items));
  }
}

async function main() {
  let browser = null, pageB = null;
  const watchdog = setTimeout(async () => {
    await out({ ok: false, error: "watchdog: gave up after " + (3 * timeoutMs / 1000 + 30) + " s" });
    process.exit(1);
  }, 3 * timeoutMs + 30000);
  try {
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS, timeout: 60000 });
    if (opts.watch) {
      pageB = await openPage(browser, urls[0], debug.b.console);
      await waitConnected(pageB, "watched");
      await out({ connected: true });
      const seen = await waitMessage(pageB, "watched");
      if (opts.screenshot) { await pageB.screenshot({ path: opts.screenshot }); }
      await out({ ok: true, seen: seen });
      return 0;
    }
    const pageA = await openPage(browser, urls[0], debug.a.console);
    pageB = await openPage(browser, urls[1], debug.b.console);
    await Promise.all([waitConnected(pageA, "A"), waitConnected(pageB, "B")]);
    await pageA.fill("#nick", opts.nick);
    await pageA.fill("#text", text);
    await pageA.click("#send");
    const [seenB, seenA] = await Promise.all([
      waitMessage(pageB, "B"),
      opts.checkA ? waitMessage(pageA, "A") : Promise.resolve(null),
    ]);
    if (seenB !== expected) { throw new Error("B shows " + JSON.stringify(seenB) + ", expected " + JSON.stringify(expected)); }
    if (opts.screenshot) { await pageB.screenshot({ path: opts.screenshot }); }
    const result = { ok: true, seen_on_b: seenB };
    if (opts.checkA) { result.seen_on_a = seenA; }
    await out(result);
    return 0;
  } catch (e) {
    if (opts.screenshot && pageB) { await pageB.screenshot({ path: opts.screenshot }).catch(() => {}); }
    await out({ ok: false, error: String(e && e.message || e), console_a: debug.a.console.slice(-20), console_b: debug.b.console.slice(-20) });
    return 1;
  } finally {
    clearTimeout(watchdog);
    if (browser) { await browser.close().catch(() => {}); }
  }
}

main().then((code) => process.exit(code));
