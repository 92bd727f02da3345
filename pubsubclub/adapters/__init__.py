"""Client front-ends beside WAMP (NSD, TEP, ...), each bridged onto the node's hub."""
