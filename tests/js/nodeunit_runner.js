// Runs one file of Autobahn|JS's nodeunit-style suite (npm's autobahn 19.4.1 ships it
// in test/) without nodeunit: tests/helpers/autobahn_js_npm.py starts this once per file.
//
//   node nodeunit_runner.js <test file> <timeout ms>
//
// The file's exports are its tests. Each is called in turn with a test case object
// offering what the suite's router files use (expect, ok, equal, deepEqual, done),
// with nodeunit's meaning: a failed assertion is recorded, not thrown, and done()
// checks the count given to expect(). A test that does not call done() within the
// timeout fails. Before the file is loaded, $PUBSUBCLUB_SUITE_SETUP (the setup file of
// the vitest suite) points testutil.config at the node under test and redirects
// RawSocket dials of 127.0.0.1:8080.
//
// The tests log freely on stdout; at the end one line per test,
// "PUBSUBCLUB-RESULT " + JSON {name, passed, assertions, failures}, then the process exits
// (the suite leaves sessions open).
"use strict";

const assert = require("assert");
const path = require("path");

const MARKER = "PUBSUBCLUB-RESULT ";

const [file, timeoutArg] = process.argv.slice(2);
const timeoutMs = Number(timeoutArg);
if (!file || !(timeoutMs > 0)) {
  throw new Error("usage: node nodeunit_runner.js <test file> <timeout ms>");
}
if (process.env.PUBSUBCLUB_SUITE_SETUP) {
  require(process.env.PUBSUBCLUB_SUITE_SETUP);
}

// The test running now, to charge uncaught exceptions to; null between tests.
let current = null;

function describe(error) {
  return error && error.stack ? String(error.stack).split("\n").slice(0, 3).join(" | ") : String(error);
}

process.on("uncaughtException", (error) => {
  if (current) {
    current.failures.push(`uncaught exception: ${describe(error)}`);
  } else {
    console.log(`uncaught exception between tests: ${describe(error)}`);
  }
});

// One test's record: assertions counted and failures kept even after done() (a late
// failure, such as the suite's own 3 s timeout handler firing, still fails the test).
class TestCase {
  constructor(name, finished) {
    this.name = name;
    this.assertions = 0;
    this.expected = null;
    this.failures = [];
    this.finished = false;
    this._finish = finished;
  }

  _record(passed, message) {
    this.assertions += 1;
    if (!passed) {
      this.failures.push(`${this.finished ? "after done(): " : ""}${message}`);
    }
  }

  expect(count) {
    this.expected = count;
  }

  ok(value, message) {
    this._record(Boolean(value), `ok(${JSON.stringify(value)}) ${message === undefined ? "" : message}`);
  }

  equal(actual, expected, message) {
    // nodeunit's equal is ==.
    this._record(actual == expected, `equal(${JSON.stringify(actual)}, ${JSON.stringify(expected)}) ${message || ""}`);
  }

  deepEqual(actual, expected, message) {
    let same = true;
    try {
      assert.deepEqual(actual, expected);
    } catch (error) {
      same = false;
    }
    this._record(same, `deepEqual(${JSON.stringify(actual)}, ${JSON.stringify(expected)}) ${message || ""}`);
  }

  done() {
    if (this.finished) {
      this.failures.push("done() called again");
      return;
    }
    this.finished = true;
    if (this.expected !== null && this.expected !== this.assertions) {
      this.failures.push(`expected ${this.expected} assertions, ${this.assertions} ran`);
    }
    this._finish();
  }
}

function runOne(name, fn) {
  return new Promise((resolve) => {
    let timer = null;
    const test = new TestCase(name, () => {
      clearTimeout(timer);
      resolve(test);
    });
    timer = setTimeout(() => {
      test.failures.push(`timed out: done() not called within ${timeoutMs} ms`);
      test.finished = true;
      resolve(test);
    }, timeoutMs);
    current = test;
    try {
      fn(test);
    } catch (error) {
      test.failures.push(`threw: ${describe(error)}`);
      test.finished = true;
      clearTimeout(timer);
      resolve(test);
    }
  });
}

async function main() {
  const tests = require(path.resolve(file));
  const names = Object.keys(tests).filter((name) => typeof tests[name] === "function");
  if (names.length === 0) {
    throw new Error(`${file} exports no tests`);
  }
  const done = [];
  for (const name of names) {
    done.push(await runOne(name, tests[name]));
  }
  // Let late callbacks of the last test (a timeout handler, a second done()) land first.
  await new Promise((resolve) => setImmediate(resolve));
  current = null;
  for (const test of done) {
    const record = { name: test.name, passed: test.failures.length === 0, assertions: test.assertions, failures: test.failures };
    process.stdout.write(MARKER + JSON.stringify(record) + "\n");
  }
  process.exit(0);
}

main().catch((error) => {
  process.stdout.write(MARKER + JSON.stringify({ name: null, passed: false, assertions: 0, failures: [describe(error)] }) + "\n");
  process.exit(1);
});
