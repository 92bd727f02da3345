// Setup file for Autobahn|JS's router suite (tests/autobahn_js.py runs it).
//
// The suite connects to the router through the shared `testutil.config` object
// (url ws://127.0.0.1:8080/ws, realm realm1), except test_rawsocket_transport,
// which dials RawSocket on 127.0.0.1:8080 (Crossbar's "universal" transport).
// This file changes nothing in the suite's files: it sets `testutil.config.url`
// to $PUBSUBCLUB_SUITE_URL and sends RawSocket connections to 127.0.0.1:8080 to
// $PUBSUBCLUB_SUITE_RAWSOCKET_PORT instead (the node's --rawsocket listener).
"use strict";

const net = require("net");
const path = require("path");

const root = process.env.PUBSUBCLUB_SUITE_ROOT;
const url = process.env.PUBSUBCLUB_SUITE_URL;
const rawsocketPort = Number(process.env.PUBSUBCLUB_SUITE_RAWSOCKET_PORT);
if (!root || !url || !rawsocketPort) {
  throw new Error("PUBSUBCLUB_SUITE_ROOT, PUBSUBCLUB_SUITE_URL and PUBSUBCLUB_SUITE_RAWSOCKET_PORT must be set");
}

require(path.join(root, "test", "testutil.js")).config.url = url;

if (!net.connect.pubsubclubRedirect) {
  const connect = net.connect;
  const redirected = function (options, ...rest) {
    if (options && typeof options === "object" && Number(options.port) === 8080 &&
        (options.host === undefined || options.host === "127.0.0.1" || options.host === "localhost")) {
      options = Object.assign({}, options, { host: "127.0.0.1", port: rawsocketPort });
    }
    return connect.call(this, options, ...rest);
  };
  redirected.pubsubclubRedirect = true;
  net.connect = redirected;
  net.createConnection = redirected;
}

// The suite's Testlog.check() returns "Expected ... Got ..." on a mismatch, but its
// nodeunit adapter drops assertion messages ("expected false to be truthy"). Keep
// each mismatch in $PUBSUBCLUB_SUITE_ROOT/../testlog/<baseline name> for the report.
const Testlog = require(path.join(root, "test", "testutil.js")).Testlog;
if (!Testlog.prototype.check.pubsubclubKept) {
  const fs = require("fs");
  const check = Testlog.prototype.check;
  const kept = function () {
    const result = check.apply(this, arguments);
    if (result) {
      const dir = path.join(root, "..", "testlog");
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(path.join(dir, path.basename(this._filename)), result);
    }
    return result;
  };
  kept.pubsubclubKept = true;
  Testlog.prototype.check = kept;
}
