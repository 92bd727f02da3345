"""The client front-ends of a node, one package per client protocol, each bridged onto the hub."""
