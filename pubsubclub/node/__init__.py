"""The composition root: the Node (hub, federation, discovery, front-ends), its ops listener and its process."""
