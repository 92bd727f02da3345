"""The node core: the hub (topic -> local sinks), its envelope and bounds, patterns, metrics and dumps."""
