#!/usr/bin/env node
// One autobahn-js caller for tests/test_one_router_app.py.
//
//   node one_router_call.js --url ws://127.0.0.1:PORT/ws [--realm realm1] --procedure P \
//        [--args JSON-array] [--kwargs JSON-object] [--timeout S]
//
// Calls P once with receive_progress: true and prints one JSON line per
// progressive result ({"progress": [...]}), then {"result": {"args": [...],
// "kwargs": {...}}} or {"error": URI, "args": [...], "kwargs": {...}} (a WAMP
// error is an answer, exit 0). Exit 1 on timeout (default 20 s) or a lost
// session, with {"fatal": ...} on stderr; exit 2 on bad usage.
"use strict";

const path = require("path");
const autobahn = require(path.resolve(__dirname, "..", "..", "js", "node_modules", "autobahn"));

const opts = {};
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
    process.stderr.write("usage: one_router_call.js --url URL --procedure P [--args JSON] [--kwargs JSON]\n");
    process.exit(2);
  }
  opts[argv[i].slice(2)] = argv[i + 1];
}
if (!opts.url || !opts.procedure) {
  process.stderr.write("--url and --procedure are required\n");
  process.exit(2);
}
const args = opts.args ? JSON.parse(opts.args) : [];
const kwargs = opts.kwargs ? JSON.parse(opts.kwargs) : {};
const timeoutS = opts.timeout ? Number(opts.timeout) : 20;

function out(obj) { process.stdout.write(JSON.stringify(obj) + "\n"); }
function fatal(msg) {
  process.stderr.write(JSON.stringify({ fatal: msg }) + "\n");
  process.exit(1);
}
setTimeout(() => fatal("timeout"), timeoutS * 1000).unref();

let done = false;
const connection = new autobahn.Connection({ url: opts.url, realm: opts.realm || "realm1", max_retries: 0 });
connection.onopen = function (session) {
  session.call(opts.procedure, args, kwargs, { receive_progress: true }).then(
    function (res) {
      const r = res instanceof autobahn.Result ? { args: res.args, kwargs: res.kwargs } : { args: [res], kwargs: {} };
      out({ result: r });
      done = true;
      connection.close();
    },
    function (err) {
      out({ error: err.error, args: err.args, kwargs: err.kwargs });
      done = true;
      connection.close();
    },
    function (progress) {
      out({ progress: progress instanceof autobahn.Result ? progress.args : progress });
    },
  );
};
connection.onclose = function (reason) {
  if (done) { process.exit(0); }
  fatal("closed: " + reason);
};
connection.open();
