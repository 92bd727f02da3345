#!/usr/bin/env node
// WAMP v2 test client (autobahn-js under node) for pubsubclub tests.
//
//   node wamp_client.js --url ws://127.0.0.1:PORT/ws --realm realm1 \
//        publish --topic T --count N [--payload JSON] [--interval MS] [--timeout S]
//     Publishes N events (acknowledge: true, sequentially, each waiting for its
//     ack), event k (0-based) having the single positional arg {"i": k, ...payload}.
//     Prints {"published": N} and exits 0.
//
//   node wamp_client.js --url ws://127.0.0.1:PORT/ws --realm realm1 \
//        subscribe --topic T --count N [--timeout S]
//     Prints {"ready": true} once the subscription is acknowledged, then one line
//     {"args": [...], "kwargs": {...}} per event; exits 0 after N events.
//     With --get-retained 1 the SUBSCRIBE asks for retained events and each line
//     also has "retained": details.retained.
//
// Authentication (optional): --authid ID with --ticket T (WAMP-Ticket) or
// --secret S (WAMP-CRA, autobahn.auth_cra). Then the first stdout line is
// {"joined": {"authid": ..., "authrole": ..., "authmethod": ...}} from WELCOME,
// and an ABORT (e.g. wamp.error.authentication_failed) exits 1 at once with
// {"error": "aborted: <reason> <message>"} on stderr.
//
// Every stdout line is one JSON object. Exit 1 (reason as a JSON line
// {"error": ...} on stderr) on timeout (default 30 s, counted from start,
// connecting included), on a WAMP error, or when the session is lost before
// the work is done. Exit 2 on bad usage. Connecting is retried until the timeout,
// so the client may be started before the server listens.
"use strict";

const path = require("path");
const autobahn = require(path.resolve(__dirname, "..", "..", "js", "node_modules", "autobahn"));

function usage(msg) {
  process.stderr.write((msg ? msg + "\n" : "") +
    "usage: wamp_client.js --url URL [--realm REALM] publish --topic T [--count N] [--payload JSON] [--interval MS] [--timeout S]\n" +
    "       wamp_client.js --url URL [--realm REALM] subscribe --topic T [--count N] [--timeout S]\n");
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {};
  let command = null;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-h" || a === "--help") { usage(); }
    if (a.startsWith("--")) {
      const eq = a.indexOf("=");
      if (eq > 0) { opts[a.slice(2, eq)] = a.slice(eq + 1); continue; }
      if (i + 1 >= argv.length) { usage("missing value for " + a); }
      opts[a.slice(2)] = argv[++i];
    } else if (command === null) {
      command = a;
    } else {
      usage("unexpected argument: " + a);
    }
  }
  return { command, opts };
}

const { command, opts } = parseArgs(process.argv.slice(2));
if (command !== "publish" && command !== "subscribe") { usage("command must be publish or subscribe"); }
if (!opts.url) { usage("--url is required"); }
if (!opts.topic) { usage("--topic is required"); }
const realm = opts.realm || "realm1";
const count = opts.count === undefined ? 1 : Number(opts.count);
const timeoutS = opts.timeout === undefined ? 30 : Number(opts.timeout);
const intervalMs = opts.interval === undefined ? 0 : Number(opts.interval);
if (!Number.isInteger(count) || count < 0) { usage("--count must be an integer >= 0"); }
if (!(timeoutS > 0)) { usage("--timeout must be > 0"); }
if (!(intervalMs >= 0)) { usage("--interval must be >= 0"); }
let payload = {};
if (opts.payload !== undefined) {
  try { payload = JSON.parse(opts.payload); } catch (e) { usage("--payload is not JSON: " + e.message); }
  if (payload === null || typeof payload !== "object" || Array.isArray(payload)) { usage("--payload must be a JSON object"); }
}

if ((opts.ticket !== undefined || opts.secret !== undefined) && !opts.authid) { usage("--ticket/--secret need --authid"); }
if (opts.ticket !== undefined && opts.secret !== undefined) { usage("give --ticket or --secret, not both"); }
const authOptions = {};
if (opts.authid) {
  authOptions.authid = opts.authid;
  if (opts.ticket !== undefined) {
    authOptions.authmethods = ["ticket"];
    authOptions.onchallenge = (session, method, extra) => opts.ticket;
  } else if (opts.secret !== undefined) {
    authOptions.authmethods = ["wampcra"];
    authOptions.onchallenge = (session, method, extra) => autobahn.auth_cra.sign(opts.secret, extra.challenge);
  }
}

let finished = false;
let connection = null;

function emit(obj) { process.stdout.write(JSON.stringify(obj) + "\n"); }

function finish(code, error) {
  if (finished) { return; }
  finished = true;
  clearTimeout(timer);
  if (error !== undefined) { process.stderr.write(JSON.stringify({ error: String(error) }) + "\n"); }
  try { if (connection) { connection.close(); } } catch (e) { /* already closed */ }
  // Exit once stdout is flushed (matters when it is a pipe).
  process.stdout.write("", () => process.exit(code));
}

const timer = setTimeout(() => finish(1, "timeout after " + timeoutS + " s"), timeoutS * 1000);

function wampError(err) {
  if (err && err.error) { return err.error + (err.args && err.args.length ? " " + JSON.stringify(err.args) : ""); }
  return String(err && err.message || err);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function doPublish(session) {
  for (let k = 0; k < count; k++) {
    await session.publish(opts.topic, [Object.assign({ i: k }, payload)], {}, { acknowledge: true });
    if (intervalMs > 0 && k + 1 < count) { await sleep(intervalMs); }
  }
  emit({ published: count });
  finish(0);
}

function doSubscribe(session) {
  let seen = 0;
  const retained = opts["get-retained"] === "1";
  return session.subscribe(opts.topic, (args, kwargs, details) => {
    if (finished || seen >= count) { return; }
    seen++;
    const line = { args: args || [], kwargs: kwargs || {} };
    if (retained) { line.retained = Boolean(details && details.retained); }
    emit(line);
    if (seen >= count) { finish(0); }
  }, retained ? { get_retained: true } : {}).then(() => {
    emit({ ready: true });
    if (count === 0) { finish(0); }
  });
}

connection = new autobahn.Connection({
  url: opts.url,
  realm: realm,
  initial_retry_delay: 0.2,
  max_retry_delay: 1,
  retry_delay_growth: 1.5,
  max_retries: -1,            // keep retrying until our own timeout
  ...authOptions,
});

let opened = false;
connection.onopen = (session, details) => {
  if (opened) {               // a second session means the first one was lost
    finish(1, "session lost before " + command + " was done");
    return;
  }
  opened = true;
  if (opts.authid) {            // WELCOME details, as the router sent them
    emit({ joined: { authid: details.authid, authrole: details.authrole, authmethod: details.authmethod } });
  }
  const work = command === "publish" ? doPublish(session) : doSubscribe(session);
  Promise.resolve(work).catch((err) => finish(1, command + " failed: " + wampError(err)));
};

connection.onclose = (reason, details) => {
  if (finished) { return true; }
  if (opened) { finish(1, "connection closed: " + reason + (details && details.reason ? " (" + details.reason + ")" : "")); return true; }
  if (reason === "unsupported") { finish(1, "WebSocket unsupported"); return true; }
  if (details && typeof details.reason === "string" && details.reason.startsWith("wamp.error.")) {
    finish(1, "aborted: " + details.reason + (details.message ? " " + details.message : ""));
    return true;
  }
  return false;               // not yet connected: let autobahn retry
};

connection.open();
