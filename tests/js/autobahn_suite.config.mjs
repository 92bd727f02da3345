// Vitest configuration for running Autobahn|JS's router integration suite against
// pubsubclub nodes (tests/autobahn_js.py passes --root, the files and the reporters).
// It mirrors upstream's vitest.config.js (globals, its CWD setup file, one fork so
// that files run one after another), with a shorter test timeout, and adds our setup
// file, which points the suite at the node under test instead of 127.0.0.1:8080.
export default {
  test: {
    setupFiles: ["test/vitest.setup.js", process.env.PUBSUBCLUB_SUITE_SETUP],
    include: ["test/**/*.vitest.js"],
    globals: true,
    // Upstream allows 30 s. The slowest passing test takes about 6 s, while a file
    // that cannot connect (test_serialization_cbor without wamp.2.cbor) waits out the
    // whole timeout in each of its tests: 15 s keeps the run short.
    testTimeout: 15000,
    pool: "forks",
    poolOptions: { forks: { singleFork: true } },
    watch: false,
  },
};
